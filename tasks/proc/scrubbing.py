"""Secrets out of everything we print or publish: Hugging Face tokens (``hf_`` + at least 8
letters or digits, the form huggingface_hub's tokens take) become ``hf_***``. Used for error
messages (download, catalog, publish) and for the data-file lines ``verify.json`` quotes, which
are published in bundles."""

from __future__ import annotations

import re

_TOKEN_RE = re.compile(r"hf_[A-Za-z0-9]{8,}")


def scrub(text: str) -> str:
    """``text`` with every Hugging Face token replaced by ``hf_***``."""
    return _TOKEN_RE.sub("hf_***", str(text))


def sample_text(text: str, limit: int = 60) -> str:
    """A data-file line as ``verify.json`` quotes it: scrubbed, cut to ``limit`` characters
    (``...`` marks a cut)."""
    text = scrub(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
