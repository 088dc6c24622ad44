"""Where things live. Every location can be moved by an environment variable, so that tests
and ``reproduce`` can use an empty cache without touching the user's.

| variable | default | holds |
|---|---|---|
| ``NPUBUILD_ROOT`` | the project folder (parent of ``tasks/``) | ``recipes/``, data files |
| ``NPUBUILD_CACHE`` | ``<root>/cache`` | ``<kind>/<key>/`` cache entries |
| ``NPUBUILD_BUILD`` | ``<root>/build`` | ``<recipe>/`` outputs that point into the cache |
| ``NPUBUILD_HOME`` | ``<root>/.npubuild`` | the stat cache and the doit database |
| ``NPUBUILD_ALLOW_PATHS`` | (none) | folders outside the root that recipes may name (``os.pathsep``-separated) |
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def _env(name: str, default: Path) -> Path:
    """``$name`` if set, else ``default``. Raises ValueError for a relative ``$name``: doit
    runs in the dodo.py folder, so a relative path would silently land there."""
    v = os.environ.get(name)
    if not v:
        return Path(default).absolute()
    if not Path(v).is_absolute():
        raise ValueError(f"{name}={v!r}: expected an absolute path (doit changes into the dodo.py folder)")
    return Path(v)


_MEMO: dict[tuple, Path] = {}


def _remembered(k: tuple, make) -> Path:
    """``make()``, remembered under ``k`` (the environment values it depends on: a no-op build
    asks ~900 times), so a changed environment is still seen."""
    p = _MEMO.get(k)
    if p is None:
        p = _MEMO[k] = make()
    return p


def _at(name: str, sub: str) -> Path:
    """``$name``, else ``root() / sub``."""
    return _remembered((name, os.environ.get(name), os.environ.get("NPUBUILD_ROOT")), lambda: _env(name, root() / sub))


def root() -> Path:
    return _remembered(("NPUBUILD_ROOT", os.environ.get("NPUBUILD_ROOT")), lambda: _env("NPUBUILD_ROOT", PROJECT_ROOT))


def recipes_dir() -> Path:
    return _at("NPUBUILD_RECIPES", "recipes")


def cache_dir() -> Path:
    return _at("NPUBUILD_CACHE", "cache")


def build_dir() -> Path:
    return _at("NPUBUILD_BUILD", "build")


def state_dir() -> Path:
    return _at("NPUBUILD_HOME", ".npubuild")


def dist_dir() -> Path:
    return _at("NPUBUILD_DIST", "dist")


def catalog_dir() -> Path:
    return _at("NPUBUILD_CATALOG", "catalog")


def allowed_dirs() -> list[Path]:
    """The resolved project root and the folders of ``NPUBUILD_ALLOW_PATHS`` (separated by
    ``os.pathsep``): where a recipe's data files and ``source.path`` may lie. Raises
    ValueError for a relative entry."""
    out = [root().resolve()]
    for v in os.environ.get("NPUBUILD_ALLOW_PATHS", "").split(os.pathsep):
        if v:
            if not Path(v).is_absolute():
                raise ValueError(f"NPUBUILD_ALLOW_PATHS entry {v!r} is not an absolute path")
            out.append(Path(v).resolve())
    return out
