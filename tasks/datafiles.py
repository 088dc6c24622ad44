"""Recipe data files as every stage reads them (calibration text, verify prompts): shared by the
encoder and LLM implementations, importing nothing of either."""

from __future__ import annotations

from pathlib import Path

from tasks.errors import InputError


def read_lines(path: Path, n: int) -> list[str]:
    """The first ``n`` non-empty, stripped lines of a UTF-8 text file (strict: the recipe's
    load check reads it the same way, ``tasks.recipe.load``). Raises ValueError if the file has
    fewer, UnicodeDecodeError on bytes that are not UTF-8."""
    lines = [ln.strip() for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
    if len(lines) < n:
        raise InputError(f"{path}: wants {n} samples, the file has {len(lines)} non-empty lines")
    return lines[:n]
