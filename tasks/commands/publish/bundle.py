"""What a bundle holds, computed in memory (nothing written): the artifacts of a verified
recipe's current stage keys (:func:`bundle_sources`), each read in full and checked against its
cache entry (:func:`shipped_digests`), the build key (:func:`short_key`) and ``manifest.json``
(:func:`build_manifest`: sha256 and size of every other file, the resolved recipe, every stage
key, tool versions, source commit, build platform); :func:`.write.plan_bundle` puts them
together with the model card (:mod:`.card`).

Determinism: the same cache entries give the same bundle; nothing depends on time, folder or
order. What a cache manifest records but the bundle leaves out on purpose, because it differs
from one build to the next although the artifacts do not, is listed in :data:`NOT_RECORDED`
(and written into manifest.json under that name)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tasks.store import digest
from tasks.core.resolve import cache as cache_of
from tasks.core.session import Session
from tasks.core.state import artifacts
from tasks.core.row import label
from tasks.commands.publish.errors import PublishError

MANIFEST_SCHEMA = 1
NOT_RECORDED = {
    "host.platform": "kernel release and libc of the build host (varies with host updates; artifacts do not)",
    "hostname, user, absolute paths": "never recorded: they name the machine, not the build",
    "timings": "build durations and finish times of the cache entries",
    "mtime_ns, xxh3": "cache-internal file stamps; the bundle lists sha256 and size instead",
    "built_for": "the recipe that first built a shared cache entry (depends on build order)",
}


def resolved_recipe(recipe) -> dict:
    """``manifest.json``'s ``resolved_recipe``: ``recipe`` (a loaded Recipe, every default and
    the family's default bars in) as JSON, with only the keys its family's stages read: a key
    of the stage sections that only the other family reads (:func:`tasks.contract.schema.readers`:
    an encoder's ``export.context_length``, ``bundle.runtimes``, ``verify.max_new_tokens``...;
    an LLM's ``verify.data.max_length``...) is left out, and a section left empty with it."""
    from tasks.contract.schema import declared, readers

    fam = recipe.export.family
    out = recipe.model_dump(mode="json")
    for section, params in declared().items():
        for p in params:
            if fam in readers(p):
                continue
            *path, leaf = [section, *p.path.split(".")]
            node = out
            for k in path:
                node = node.get(k) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(leaf, None)
        for sub in sorted({p.path.split(".")[0] for p in params if "." in p.path}):
            if out.get(section, {}).get(sub) == {}:
                del out[section][sub]
        if out.get(section) == {}:
            del out[section]
    return out


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def short_key(status) -> str:
    """12 hex: the start of the xxh3 of every stage's key ({stage: key}, canonical JSON): the
    archive's name and the build key. One name, one set of stage keys, so one manifest: named
    by the verify key alone, a rebuilt quantize whose output was byte-identical (early cut-off:
    same verify key) gave an archive of the same name with another manifest (found by a new
    user). ``status`` comes from :func:`tasks.core.status.recipe_status`."""
    return digest.digest_json({s: e.key for s, e in status.entries.items()})[:12]


def bundle_sources(status) -> dict[str, Path]:
    """{bundle-relative POSIX path: cache file} of the artifacts (:func:`tasks.core.state.artifacts`,
    the listing ``build/<recipe>/`` links): EPContext models and context binaries, tokenizer and
    config files, ``verify.json``. Publish ships those :func:`.contents.shipped_files` keeps."""
    return {rel: a.path for rel, a in artifacts(status.build).items()}


def shipped_digests(session: Session, status, sources: dict[str, Path]) -> dict[str, tuple[str, int]]:
    """{bundle path: (sha256, size)} of the cache files ``sources`` ({bundle path: cache file},
    :func:`bundle_sources`), each read in full (never the stat cache) and checked against its
    cache entry's manifest (xxh3 and size): a file damaged in the cache with its size and mtime
    kept (invisible to a build's stat check) is never shipped. Raises PublishError naming the
    file and the entry, after quarantining the entry (``Cache.confirm_damage``: it is moved to
    ``cache/.damaged/`` and the ``build/`` folders that link to it are cleared)."""
    out = {}
    for rel, path in sources.items():
        e = next(e for e in status.entries.values() if path.is_relative_to(e.out))
        inner = path.relative_to(e.out).as_posix()
        want = e.manifest["outputs"][inner]
        xxh3, sha = digest.xxh3_and_sha256(path)
        size = path.stat().st_size
        if (xxh3, size) != (want["xxh3"], want["size"]):
            moved = cache_of(session).confirm_damage(e.kind, e.key, [f"{inner}: content differs (xxh3)"])
            raise PublishError(
                f"refusing to publish {rel}: cache entry {e.kind}/{e.key} file {inner} does not match "
                f"its manifest (xxh3 {xxh3[:16]}, manifest {want['xxh3'][:16]}; size {size}, manifest "
                f"{want['size']}): the entry is damaged"
                + (f"; moved to {moved}" if moved else "")
                + f". Run `doit build:{status.build.recipe}` to rebuild it, then publish again."
            )
        out[rel] = (sha, size)
    return out


def merged_tools(entries: dict) -> dict:
    """{tool: version} over every stage entry's manifest (several versions joined by ", ")."""
    vals: dict[str, set] = {}
    for e in entries.values():
        for t, v in e.manifest.get("tools", {}).items():
            vals.setdefault(t, set()).add(v)
    return {t: ", ".join(sorted(v)) for t, v in sorted(vals.items())}


def _build_platform(entries: dict) -> dict:
    hosts = {
        json.dumps({k: e.manifest.get("host", {}).get(k) for k in ("system", "machine", "python")}, sort_keys=True)
        for e in entries.values()
        if e.kind in ("compile", "verify")
    }
    got = [json.loads(h) for h in sorted(hosts)]
    return got[0] if len(got) == 1 else {"hosts": got}


def source_commit_time(status) -> int | None:
    """Seconds since the epoch of the source commit, when the download entry recorded one
    (``info.commit_time``); None otherwise (package and path sources have no commit, and the
    download stage does not ask the Hub for commit times)."""
    t = status.entries["download"].manifest.get("info", {}).get("commit_time")
    return int(t) if t is not None else None


def archive_mtime(status) -> tuple[int, str]:
    """(mtime, where from) for every archive entry: SOURCE_DATE_EPOCH, else the source
    commit's time, else 0. Raises PublishError for a SOURCE_DATE_EPOCH that is not an int."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        try:
            return int(env), "SOURCE_DATE_EPOCH"
        except ValueError:
            raise PublishError(f"SOURCE_DATE_EPOCH must be an integer, found {env!r}") from None
    t = source_commit_time(status)
    return (t, "source commit time") if t is not None else (0, "unknown (0)")


def build_manifest(recipe_name: str, recipe, status, files: dict[str, tuple[str, int]], row: dict) -> dict:
    """manifest.json content of ``recipe`` (its Recipe), named ``recipe_name``. ``files``: {rel
    path: (sha256, size)} of every bundle file but manifest.json. Keys: schema_version, recipe,
    build_key, state (``verified`` or ``built (no bars)``: :func:`tasks.core.row.label`),
    files {rel: {sha256, size}}, resolved_recipe (:func:`resolved_recipe`: the keys its family
    reads), stages {stage: {kind, key, output_digest, tools}}, tools (all stages' tools merged),
    source (kind, repo, commit, package_version...), build_platform (system, machine, python of
    the compile/verify hosts), verify {target: {backend, runtime, metrics, thresholds}},
    qnn_context_sdk, archive_mtime, not_recorded."""
    ents = status.entries
    mtime, mfrom = archive_mtime(status)
    return {
        "schema_version": MANIFEST_SCHEMA,
        "recipe": recipe_name,
        "build_key": short_key(status),
        "state": label(status.state),
        "files": {rel: {"sha256": h, "size": n} for rel, (h, n) in sorted(files.items())},
        "resolved_recipe": resolved_recipe(recipe),
        "stages": {
            s: {"kind": e.kind, "key": e.key, "output_digest": e.output_digest, "tools": e.manifest.get("tools", {})}
            for s, e in ents.items()
        },
        "tools": merged_tools(ents),
        "source": row["source"],
        "build_platform": _build_platform(ents),
        "verify": {
            t: {k: v.get(k) for k in ("backend", "runtime", "metrics", "thresholds")} for t, v in row["verify"].items()
        },
        "qnn_context_sdk": row["qnn_context_sdk"],
        "archive_mtime": {"seconds": mtime, "from": mfrom},
        "not_recorded": NOT_RECORDED,
    }


def json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
