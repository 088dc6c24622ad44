"""Registry of named, versioned ONNX graph rewrites ("patches").

One module per patch in this package. Each module registers one function with
:func:`register`; the name and the version enter the patch stage's key, so bumping
``version`` makes every build that uses the patch stale.

A patch function has the signature ``fn(model: onnx.ModelProto, **params) -> PatchResult``.
It may change ``model`` in place or return a new one. When the patch does not apply to a
graph it must return ``PatchResult(model, changed=False, note="...why...")`` and leave the
graph byte-for-byte unchanged, so that early cut-off holds downstream.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from collections.abc import Callable

if TYPE_CHECKING:
    import onnx


@dataclass
class PatchResult:
    """What a patch did: the (possibly new) model, whether it changed, and a log line."""

    model: onnx.ModelProto
    changed: bool
    note: str = ""
    counts: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Patch:
    name: str
    version: int
    fn: Callable[..., PatchResult]
    doc: str


REGISTRY: dict[str, Patch] = {}


def register(name: str, version: int):
    """Decorator: register ``fn`` as patch ``name`` at ``version`` (an int, bumped on any change
    of behaviour). Raises ValueError on a duplicate name."""

    def deco(fn):
        if name in REGISTRY:
            raise ValueError(f"patch {name!r} registered twice")
        REGISTRY[name] = Patch(name, version, fn, (fn.__doc__ or "").strip())
        return fn

    return deco


STAGE_MODULE = "stage"  # tasks/patches/stage.py: the patch stage (every family)
#: the patch modules of this package (``stage`` is the patch stage that applies them, not a patch)
MODULES = tuple(f"{__name__}.{m.name}" for m in pkgutil.iter_modules(__path__) if m.name != STAGE_MODULE)


def _load_all() -> None:
    """Import every patch module of this package that is not imported yet (each registers
    its patches when imported)."""
    for name in MODULES:
        if name not in sys.modules:
            importlib.import_module(name)


def get(name: str) -> Patch:
    """Return the registered patch ``name``; KeyError lists the known names."""
    _load_all()
    if name not in REGISTRY:
        raise KeyError(f"unknown patch {name!r}; known patches: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def check_params(name: str, params: dict) -> None:
    """Check ``params`` against patch ``name``'s signature and type hints, without running it.
    Raises ValueError naming the unknown parameter, or the parameter, the expected type and
    the value found."""
    import inspect

    from pydantic import TypeAdapter, ValidationError

    fn = get(name).fn
    sig = inspect.signature(fn)
    accepted = [p for p in list(sig.parameters)[1:]]
    hints = param_types(name)
    for key, value in params.items():
        if key not in accepted:
            raise ValueError(f"expected parameters of {name} from {accepted}, found unknown {key!r}")
        if key in hints:
            try:
                TypeAdapter(hints[key]).validate_python(value, strict=True)
            except ValidationError:
                want = getattr(hints[key], "__name__", str(hints[key]))
                raise ValueError(f"expected {name}.{key} to be {want}, found {value!r}") from None


def param_types(name: str) -> dict:
    """The type hints of patch ``name``'s parameters (not of its model argument or result, so
    that reading them does not import onnx): ``typing.get_type_hints`` restricted to them."""
    import inspect
    import typing

    fn = get(name).fn
    params = list(inspect.signature(fn).parameters.values())[1:]
    ns = {p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}
    holder = type("_Hints", (), {"__annotations__": ns, "__module__": fn.__module__})
    return typing.get_type_hints(holder, globalns=fn.__globals__)


def known() -> list[str]:
    _load_all()
    return sorted(REGISTRY)
