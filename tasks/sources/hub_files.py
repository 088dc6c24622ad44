"""The download's completeness checks of a model folder (:mod:`tasks.sources.download`): what
the model format needs (:func:`format_missing`: config, weights and their shards, a tokenizer),
a Hub snapshot against the Hub's own file listing with sizes and hashes (:func:`hub_mismatches`),
both together (:func:`incomplete`) and the one-line message naming what to fetch again; whether
the Hub is offline (``HF_HUB_OFFLINE``) and a library error's whole message on one line.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.store import digest
from tasks.proc.scrubbing import scrub
from tasks.sources import SourceError, source_files
from tasks.sources.folder_files import TOKENIZER_WANTED, TOKENIZERS, WEIGHTS


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _whole(err: Exception) -> str:
    """The library's whole message on one line (its first line alone can end mid-sentence)."""
    return " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())


def format_missing(folder: Path, names: set[str], patterns: list[str] | None = None) -> list[str]:
    """What model folder ``folder`` (its files: relative POSIX ``names``) lacks to be a model:
    ``config.json``; the weights (:data:`WEIGHTS`: one file, or its index file and every shard
    the index's ``weight_map`` names); a tokenizer (one of :data:`TOKENIZERS`); and every file a
    pattern of ``patterns`` names literally (no ``*?[``). One item per missing thing, sorted."""
    missing = set()
    if "config.json" not in names:
        missing.add("config.json")
    indexes = [index for single, index in WEIGHTS if index in names]
    for index in indexes:  # a present index must have every shard, whatever else is there
        try:
            shards = set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            missing.add(f"{index}'s weight_map (unreadable: {type(e).__name__})")
            continue
        missing.update(f"{s} (a shard {index} names)" for s in shards if s not in names)
    if not indexes and not any(single in names for single, _ in WEIGHTS):
        missing.add("model.safetensors (the weights; or model.safetensors.index.json and its shards)")
    if not any(all(n in names for n in group) for group in TOKENIZERS):
        missing.add(TOKENIZER_WANTED)
    named = {m.split(" ", 1)[0] for m in missing}
    missing.update(p for p in patterns or () if not any(c in p for c in "*?[") and p not in names | named)
    return sorted(missing)


def _git_blob_sha1(path: Path) -> str:
    """The git blob id of a file (what the Hub lists for a file not stored in LFS)."""
    import hashlib

    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def hub_mismatches(repo: str, commit: str, folder: Path, patterns: list[str] | None) -> list[str]:
    """The files of ``repo`` at ``commit`` that the Hub lists (``model_info(files_metadata=True)``,
    restricted to ``patterns`` as ``snapshot_download`` restricts them) and snapshot folder
    ``folder`` lacks or holds otherwise: missing, another size, another sha256 (LFS files) or
    git blob id (the others). One item per file. Raises SourceError when the listing cannot be
    read."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    try:
        info = HfApi().model_info(repo, revision=commit, files_metadata=True)
    except Exception as e:
        raise SourceError(
            scrub(
                f"Hub model {repo!r} at commit {commit}: cannot read its file listing to check the "
                f"snapshot {folder} [{type(e).__name__}: {_whole(e)}]; nothing was cached"
            )
        ) from None
    out = []
    for s in filter_repo_objects(info.siblings or [], allow_patterns=patterns, key=lambda s: s.rfilename):
        f = folder / s.rfilename
        if not f.is_file():
            out.append(s.rfilename)
            continue
        size = f.stat().st_size
        if s.size is not None and size != s.size:
            out.append(f"{s.rfilename} (size {size}, the Hub lists {s.size})")
            continue
        want = (s.lfs.get("sha256") if isinstance(s.lfs, dict) else getattr(s.lfs, "sha256", None)) if s.lfs else None
        if want:
            got = digest.sha256_file(f)
            if got != want:
                out.append(f"{s.rfilename} (sha256 {got}, the Hub lists {want})")
        elif s.blob_id and (got := _git_blob_sha1(f)) != s.blob_id:
            out.append(f"{s.rfilename} (git blob {got}, the Hub lists {s.blob_id})")
    return out


def incomplete(folder: Path, params: dict, commit: str) -> list[str]:
    """What Hub snapshot ``folder`` (of ``params["hf"]`` at ``commit``) lacks, one item per
    file: against the Hub's file listing with sizes and hashes when online
    (:func:`hub_mismatches`), then (offline, or when the Hub's files are all there) against
    what the model format needs (:func:`format_missing`: the Hub's listing, narrowed by the
    recipe's patterns, may lack the weights). Empty when complete."""
    patterns = params.get("allow_patterns")
    if not _offline() and (hub := hub_mismatches(params["hf"], commit, folder, patterns)):
        return hub
    return format_missing(folder, {f.relative_to(folder).as_posix() for f in source_files(folder)}, patterns)


def _incomplete_message(repo: str, commit: str, folder: Path, bad: list[str]) -> str:
    n = f"{len(bad)} file{'s' if len(bad) > 1 else ''}"
    it = "it" if len(bad) == 1 else "them"
    if _offline():
        return scrub(
            f"Hub model {repo!r} at commit {commit}: the local Hugging Face cache's snapshot {folder} is "
            f"incomplete, missing {n}: {'; '.join(bad)}; nothing was cached: fetch {it} with the Hub "
            f"reachable (`hf download {repo} --revision {commit}`) and build again"
        )
    return scrub(
        f"Hub model {repo!r} at commit {commit}: the snapshot {folder} differs from the Hub's file listing "
        f"in {n}: {'; '.join(bad)}; nothing was cached: download {it} again (`hf download {repo} "
        f"--revision {commit} --force-download`) and build again"
    )
