"""Where things live. Every location can be moved by an environment variable, so that tests
and ``reproduce`` can use an empty cache without touching the user's.

| variable | default | holds |
|---|---|---|
| ``NPUBUILD_ROOT`` | the project folder (parent of ``tasks/``) | ``recipes/``, data files |
| ``NPUBUILD_CACHE`` | ``<root>/cache`` | ``<kind>/<key>/`` cache entries |
| ``NPUBUILD_BUILD`` | ``<root>/build`` | ``<recipe>/`` outputs that point into the cache |
| ``NPUBUILD_HOME`` | ``<root>/.npubuild`` | the stat cache and the doit database |
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def root() -> Path:
    return Path(os.environ.get("NPUBUILD_ROOT", PROJECT_ROOT)).absolute()


def recipes_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_RECIPES", root() / "recipes")).absolute()


def cache_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_CACHE", root() / "cache")).absolute()


def build_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_BUILD", root() / "build")).absolute()


def state_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_HOME", root() / ".npubuild")).absolute()


def dist_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_DIST", root() / "dist")).absolute()


def catalog_dir() -> Path:
    return Path(os.environ.get("NPUBUILD_CATALOG", root() / "catalog")).absolute()
