"""Model sources a recipe names (``source: {path | package}``), found without building anything:
shared by the download stage (``tasks/sources/download.py``, every family) and the LLM memory
estimate (which reads a source's config.json before any stage runs), so the LLM stages' keys
hold this file, not the Hub download code.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from .. import paths


class SourceError(Exception):
    """The recipe's source cannot be found or fetched."""


def local_folder(params: dict) -> Path:
    """The folder a ``path`` or ``package`` source names. Raises SourceError if absent."""
    if params.get("path") is not None:
        p = (paths.root() / params["path"]).absolute()
        if not p.is_dir():
            m = re.fullmatch(r"\.fixtures/tiny-(\w+)/?", params["path"])
            how = (f"train it with `.venv/bin/python scripts/tiny_llm.py {m.group(1)}` (about 2 minutes)" if m
                   else "the recipe's comments say how to make it")
            raise SourceError(f"source path {params['path']!r} is not a folder (looked at {p}); {how}")
        return p
    spec = importlib.util.find_spec(params["package"])
    if spec is None or not spec.submodule_search_locations:
        raise SourceError(f"source package {params['package']!r} is not installed (pip install it)")
    p = Path(list(spec.submodule_search_locations)[0]) / params.get("subdir", "")
    if not p.is_dir():
        raise SourceError(f"package {params['package']!r} has no folder {params.get('subdir')!r}")
    return p
