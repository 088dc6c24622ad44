"""Modules imported on first use, so that planning and up-to-date checks (``doit list``, a
no-op ``doit build``) do not pay for onnx / numpy before any stage runs.

:func:`module` is the recipe of the Python documentation, "Implementing lazy imports"
(https://docs.python.org/3/library/importlib.html#implementing-lazy-imports), built on the
standard library's ``importlib.util.LazyLoader``: the module object exists at once and its code
runs on the first attribute access. ``from x import y`` forms cannot be lazy; use ``x.y``.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def module(name: str) -> ModuleType:
    """``name`` imported lazily (the real module when it is already imported). Raises
    ModuleNotFoundError at once when ``name`` is not installed."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    loader.exec_module(mod)
    return mod
