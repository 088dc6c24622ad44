"""Kept model facts: a Hub model's ``config.json`` figures, in the repo, one file per model
(``recipes/models/<name>.json``), so a recipe whose weights are on the Hub loads, plans,
explains and is cataloged offline, and its download is checked against them.

A file holds ``{"repo", "revision", "revision_source", "config_source", "config": {...}}``:
``config`` the keys of the model's ``config.json`` that the plan, the memory and disk estimates
and the catalog's figures read (layers, hidden and intermediate sizes, heads, KV heads,
``head_dim`` when the config has one, vocabulary, rope theta and scaling, tied embeddings, max
positions, and what makes a family unsupported), ``*_source`` where each was read (a public
file naming the revision or holding the config).

:func:`check_download` compares them with the downloaded ``config.json``: a difference is one
:class:`tasks.sources.SourceError` line naming the key, the value kept and the value found.
The facts are those of a commit: the download looks them up by the commit its revision resolves
to, never by the revision's text, and its key holds their digest (:func:`key_digest`), so a
snapshot refused under a pinned commit is refused as well under a branch or tag naming that
commit (both names build one download key: issue 51 case 1), and an edit of the facts checks the
snapshot again.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tasks.sources.errors import SourceError

#: the revision an hf source names when no public source pinned one: its download refuses
UNPINNED = "unpinned"


def facts_dir() -> Path:
    from tasks.store.paths import recipes_dir

    return Path(recipes_dir()) / "models"


@cache
def _all(folder: str) -> tuple:
    out = []
    for f in sorted(Path(folder).glob("*.json")):
        try:
            doc = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            out.append((f, doc))
    return tuple(out)


def find(repo: str | None, revision: str | None) -> tuple[Path, dict] | None:
    """(file, document) of the kept facts of Hub model ``repo`` at ``revision`` (a 40-hex commit
    or :data:`UNPINNED`), or None."""
    if not repo:
        return None
    d = facts_dir()
    if not d.is_dir():
        return None
    for f, doc in _all(str(d)):
        if doc.get("repo") == repo and doc.get("revision") == revision:
            return f, doc
    return None


def config_of(repo: str | None, revision: str | None) -> dict | None:
    """The kept ``config`` of ``repo`` at ``revision`` (a copy), or None."""
    hit = find(repo, revision)
    return dict(hit[1]["config"]) if hit else None


def key_digest(repo: str, commit: str) -> str | None:
    """xxh3 (hex) of the kept ``config`` of ``repo`` at 40-hex ``commit`` (canonical JSON: the
    provenance strings beside it do not enter), or None when none is kept: what the download
    key holds of the facts its check reads."""
    from tasks.store.digest import digest_json

    hit = find(repo, commit)
    return digest_json(hit[1]["config"]) if hit else None


def check_download(out: Path, repo: str, commit: str) -> None:
    """Raise SourceError (one line) when the downloaded ``out/config.json`` differs from the kept
    facts of ``repo`` at ``commit`` (the 40-hex commit the recipe's revision resolved to, or a
    shape build's revision, which is its facts') in any kept key: the first such key, the value
    kept (and its file) and the value found. A key the download lacks is found "absent"."""
    hit = find(repo, commit)
    if hit is None:
        return
    f, doc = hit
    cfg_file = Path(out) / "config.json"
    try:
        got = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SourceError(
            f"{repo}@{commit[:12]}: expected a readable config.json to check against {f.name}, "
            f"found {type(e).__name__}: {e}"
        ) from None
    for key, want in doc["config"].items():
        found = got.get(key, "absent") if isinstance(got, dict) else "absent"
        if found != want and not (
            isinstance(want, (int, float))
            and isinstance(found, (int, float))
            and not isinstance(found, bool)
            and float(found) == float(want)
        ):
            raise SourceError(
                f"{repo}@{commit[:12]} config.json key {key!r}: expected {json.dumps(want)[:200]} "
                f"(kept in recipes/models/{f.name}), found {json.dumps(found)[:200]}"
            )
