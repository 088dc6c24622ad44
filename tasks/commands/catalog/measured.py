"""The figures others measured on Snapdragon devices, which the catalog puts beside its own
ceilings (:mod:`tasks.llm.figures`): kept in ``published.json`` beside this module, copied by hand
from the public pages it names (with their dates), never fetched at run time."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

#: the published measurements kept in the repository
PUBLISHED = Path(__file__).resolve().parent / "published.json"


@lru_cache(maxsize=1)
def published_figures() -> dict:
    """``published.json``: {"sources": {id: {title, short, url, published, retrieved, note}},
    "figures": [{model, precision, target, device, runtime, context_length,
    decode_tokens_per_s, first_token_ms: [min, max], source, url}]}. Figures measured on real
    devices by others, copied by hand from their public pages (never fetched at run time)."""
    return json.loads(PUBLISHED.read_text(encoding="utf-8"))


def measured(row: dict) -> dict[str, list[dict]]:
    """{target: [published figure, ...]} for the row's source model and precision, on every
    target a figure exists for (not only the recipe's: a figure for a target the recipe does
    not build for is shown without a ratio). Each figure carries its source's ``title``,
    ``short`` title, ``published`` and ``retrieved`` dates beside its own ``url``. {} when none."""
    repo = row["source"].get("repo")
    if not repo:
        return {}
    data = published_figures()
    out: dict[str, list[dict]] = {}
    for f in data["figures"]:
        if f["model"] == repo and f["precision"] == row["precision"]:
            src = data["sources"][f["source"]]
            out.setdefault(f["target"], []).append(
                {
                    **f,
                    "title": src["title"],
                    "short": src["short"],
                    "published": src["published"],
                    "retrieved": src["retrieved"],
                }
            )
    return out
