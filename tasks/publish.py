"""Publishing a verified build: the bundle, its archive, and where they go.

``doit publish:<recipe>`` (:func:`publish`) refuses a recipe that is not ``verified`` (see
:mod:`tasks.catalog`: verify failed, stale build, never built), saying why; it never builds.
Otherwise it writes, from the cache entries of the recipe's current stage keys:

- ``dist/<recipe>/`` (:func:`tasks.paths.dist_dir`): the compile outputs (``*_ctx.onnx``,
  ``*.bin``, ``genai_config.json`` for LLMs; in a ``<target>/`` sub-folder each when the recipe
  has several targets), the export's tokenizer and config files, ``README.md`` (a model card
  made with ``huggingface_hub.ModelCard``: license, source, verify metrics) and
  ``manifest.json`` (:func:`build_manifest`: sha256 and size of every other file, the resolved
  recipe, every stage key, tool versions, source commit, build platform);
- ``dist/<recipe>-<short key>.tar.gz``, ``short key`` = first 12 hex of the verify stage key
  (several targets: of the xxh3 of their sorted verify keys). Deterministic
  (:func:`write_archive`): entries sorted, all under ``<recipe>/``; mtime = ``SOURCE_DATE_EPOCH``,
  else the source commit's time when the download stage recorded it, else 0; uid/gid 0,
  empty user/group names, mode 0644 (files) / 0755 (dirs); GNU tar format; gzip header with
  mtime 0 and no file name.

Determinism: publishing the same cache entries again gives byte-identical bundles and
archives; nothing in publish depends on time, folder or order. What a cache manifest records
but the bundle leaves out on purpose, because it differs from one build to the next although
the artifacts do not, is listed in :data:`NOT_RECORDED` (and written into manifest.json under
that name). Two builds from *empty* caches agree on every file, the context binaries included
(tasks/qnn.py ``compile_settled``: a compile that comes out as the QNN SDK's racy padding
variant is compiled again); no file or region is excused (tests/test_reproduce.py).

Targets: ``dest`` (a folder: the bundle is copied to ``<dest>/<recipe>/`` and the archive
to ``<dest>/``) and ``hub_repo`` (a Hugging Face Hub model repo: ``create_repo(exist_ok=True)``,
``upload_folder`` of the bundle, ``create_tag("npubuild-<short key>")`` on that commit).
``dry_run`` prints every operation and writes nothing at all (not even ``dist/``).

Shipped bytes are checked: every cache file that goes into the bundle is read in full and
checked against its cache entry's manifest before it is listed (:func:`shipped_digests`);
a damaged entry is quarantined and publish refuses, naming the file and the entry.
``--sign KEY`` signs the folder with OpenSSF model-signing (:func:`sign_bundle`).

Also :func:`check_bundle` (sha256 of every file against manifest.json: mismatches, missing
and extra files; the signature when there is one) and :func:`reproduce` (rebuild from an empty
temporary cache and compare; the published side is re-read first: :func:`recheck_published`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from . import catalog, digest, paths
from .catalog_table import arch
from .core.resolve import cache as cache_of
from .core.session import Session
from .core.state import artifacts, diff
from .stages import artifact_patterns

MANIFEST_SCHEMA = 1
NOT_RECORDED = {
    "host.platform": "kernel release and libc of the build host (varies with host updates; artifacts do not)",
    "hostname, user, absolute paths": "never recorded: they name the machine, not the build",
    "timings": "build durations and finish times of the cache entries",
    "mtime_ns, xxh3": "cache-internal file stamps; the bundle lists sha256 and size instead",
    "built_for": "the recipe that first built a shared cache entry (depends on build order)",
}


def differing_ranges(a: Path, b: Path, limit: int = 8, chunk: int = 1 << 20) -> list[tuple[int, int]] | str:
    """Byte ranges ``[start, end)`` where files ``a`` and ``b`` differ (the first ``limit``
    ranges, adjacent differing bytes merged), read ``chunk`` bytes at a time; or a sentence
    when their sizes differ. Used by :func:`reproduce` to show, not excuse, a difference."""
    import numpy as np

    sa, sb = Path(a).stat().st_size, Path(b).stat().st_size
    if sa != sb:
        return f"sizes differ: {sa} vs {sb} bytes"
    out: list[tuple[int, int]] = []
    with open(a, "rb") as fa, open(b, "rb") as fb:
        off = 0
        while len(out) < limit:
            x, y = fa.read(chunk), fb.read(chunk)
            if not x:
                break
            if x != y:
                idx = np.flatnonzero(np.frombuffer(x, np.uint8) != np.frombuffer(y, np.uint8)) + off
                for i in idx.tolist():
                    if out and out[-1][1] == i:
                        out[-1] = (out[-1][0], i + 1)
                    elif len(out) < limit:
                        out.append((i, i + 1))
            off += len(x)
    return out


class PublishError(Exception):
    """The recipe cannot be published (not verified, stale, not built) or a target failed."""


sha256_file = digest.sha256_file


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------ what goes in the bundle


def _verified_status(session: Session, recipe: str) -> "catalog.RecipeStatus":
    """The catalog status of ``recipe``; raises PublishError unless it is ``verified``."""
    recipes = catalog.catalog_recipes(session)
    if recipe not in recipes:
        raise PublishError(f"refusing to publish {recipe!r}: no such (non-abstract) recipe; "
                           f"known: {', '.join(recipes)}")
    if recipes[recipe].source.shape:
        raise PublishError(f"refusing to publish {recipe}: it is a shape build (source.shape: random weights in the "
                           f"model's configuration), built for time and memory, not a model to ship")
    st = catalog.recipe_status(recipe, session)
    if st.state == "verify-failed":
        raise PublishError(f"refusing to publish {recipe}: its verify failed:\n  " + "\n  ".join(st.failures))
    if st.state == "stale":
        raise PublishError(f"refusing to publish {recipe}: its build is stale ({st.reason}); the recipe or a "
                           f"tool changed since it was built. Run `doit build:{recipe}` first "
                           f"(`doit explain:{recipe}` shows what changed).")
    if st.state == "not-built":
        raise PublishError(f"refusing to publish {recipe}: it is not built ({st.reason}). "
                           f"Run `doit build:{recipe}` first.")
    return st


def short_key(status: "catalog.RecipeStatus") -> str:
    """12 hex: the start of the xxh3 of every stage's key ({stage: key}, canonical JSON): the
    archive's name and the build key. One name, one set of stage keys, so one manifest: named
    by the verify key alone, a rebuilt quantize whose output was byte-identical (early cut-off:
    same verify key) gave an archive of the same name with another manifest (found by a new
    user). ``status`` comes from :func:`catalog.recipe_status`."""
    return digest.digest_json({s: e.key for s, e in status.entries.items()})[:12]


def bundle_sources(status: "catalog.RecipeStatus") -> dict[str, Path]:
    """{bundle-relative POSIX path: cache file} of the artifacts (:func:`tasks.core.state.artifacts`,
    the listing ``build/<recipe>/`` links): EPContext models and context binaries, tokenizer and
    config files, ``verify.json``."""
    return {rel: a.path for rel, a in artifacts(status.build).items()}


def shipped_digests(session: Session, status: "catalog.RecipeStatus",
                    sources: dict[str, Path]) -> dict[str, tuple[str, int]]:
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
            raise PublishError(f"refusing to publish {rel}: cache entry {e.kind}/{e.key} file {inner} does not match "
                               f"its manifest (xxh3 {xxh3[:16]}, manifest {want['xxh3'][:16]}; size {size}, manifest "
                               f"{want['size']}): the entry is damaged"
                               + (f"; moved to {moved}" if moved else "")
                               + f". Run `doit build:{status.build.recipe}` to rebuild it, then publish again.")
        out[rel] = (sha, size)
    return out


def _merged_tools(entries: dict) -> dict:
    vals: dict[str, set] = {}
    for e in entries.values():
        for t, v in e.manifest.get("tools", {}).items():
            vals.setdefault(t, set()).add(v)
    return {t: ", ".join(sorted(v)) for t, v in sorted(vals.items())}


def _build_platform(entries: dict) -> dict:
    hosts = {json.dumps({k: e.manifest.get("host", {}).get(k) for k in ("system", "machine", "python")},
                        sort_keys=True) for e in entries.values() if e.kind in ("compile", "verify")}
    got = [json.loads(h) for h in sorted(hosts)]
    return got[0] if len(got) == 1 else {"hosts": got}


def source_commit_time(status: "catalog.RecipeStatus") -> int | None:
    """Seconds since the epoch of the source commit, when the download entry recorded one
    (``info.commit_time``); None otherwise (package and path sources have no commit, and the
    download stage does not ask the Hub for commit times)."""
    t = status.entries["download"].manifest.get("info", {}).get("commit_time")
    return int(t) if t is not None else None


def archive_mtime(status: "catalog.RecipeStatus") -> tuple[int, str]:
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



def _ran(v: dict) -> str:
    """A verify result's backend, with the LLM runtime that generated (``htp, genai``)."""
    return f"{v['backend']}, {v['runtime']}" if v.get("runtime") else v["backend"]

def model_card(recipe, row: dict, short: str) -> str:
    """The bundle's README.md: a ``huggingface_hub.ModelCard`` (YAML metadata: license,
    library, tags, base model for Hub sources, eval results = verify metrics) and a body with
    the source, the files, the verify metrics against their thresholds and the stage keys."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    src = row["source"]
    evals = []
    for target, v in sorted(row["verify"].items()):
        for name, val in sorted(v["metrics"].items()):
            if isinstance(val, (int, float)):
                evals.append(EvalResult(task_type=recipe.task, dataset_type="npubuild-verify",
                                        dataset_name=f"{recipe.verify.data.file} ({target}, {_ran(v)})",
                                        metric_type=name, metric_value=round(float(val), 6)))
    data = ModelCardData(
        license=recipe.license, library_name="onnxruntime", pipeline_tag=recipe.task, model_name=recipe.name,
        base_model=src.get("repo"), eval_results=evals or None,
        tags=["onnx", "qnn", "qualcomm", *(["npu"] if row.get("runs_on") == "npu" else ["npu+cpu"]), "npubuild",
              recipe.quantize.precision, *recipe.compile.targets])
    if src["kind"] == "hf":
        origin = f"[{src['repo']}](https://huggingface.co/{src['repo']}) at commit `{src.get('commit')}`"
    elif src["kind"] == "shape":
        origin = (f"**random weights** in the exact configuration of [{src['repo']}](https://huggingface.co/{src['repo']}) "
                  f"at commit `{src.get('revision')}` (a shape build: its verify figures are not the model's quality)")
    elif src["kind"] == "package":
        origin = f"the Python package `{src['package']}` {src.get('package_version', '')} (folder `{src.get('subdir', '')}`)"
    else:
        origin = f"the local folder `{src['path']}` (content xxh3 `{src.get('content_digest')}`)"
    lines = [
        "---", data.to_yaml(), "---", "", f"# {recipe.name}", "", recipe.description or "", "",
        f"Built by npubuild from {origin}, quantized {recipe.quantize.precision} and compiled to QNN context "
        f"binaries for {', '.join(recipe.compile.targets)} (onnxruntime QNN EP, EPContext models). "
        f"Build key `{short}`. License: {recipe.license}.", "",
        ("Every node of the compiled graphs runs on the NPU (QNN HTP)." if row.get("runs_on") == "npu" else
         f"Not every node runs on the NPU: {row.get('runs_on')} (the recipe allows CPU fallback: "
         f"`compile.disable_cpu_ep_fallback: false`)."), "",
        "| | |", "|---|---|",
        f"| architecture | {arch(row)} |", f"| parameters | {row['parameters']} |",
        f"| sequence length | {row['sequence_length']} |",
        *( [f"| context length | {row['context_length']} |"] if row["context_length"] else []),
        *(f"| {t} | {v} |" for t, v in sorted(row["tools"].items())), "",
        "## Verification", "",
        "| target | backend (runtime) | metric | value | threshold |", "|---|---|---|---|---|",
    ]
    for target, v in sorted(row["verify"].items()):
        for name, val in sorted(v["metrics"].items()):
            bar = v["thresholds"].get(name)
            shown = f"{val:.6f}" if isinstance(val, float) else str(val)
            lines.append(f"| {target} | {_ran(v)} | {name} | {shown} | {'' if bar is None else bar} |")
    lines += ["", "## Checked before shipping", "",
              "What ran here (on the x86_64 HTP simulator or the CPU) and what was only read back. No speed "
              "figure comes from the simulator, and nothing here loads a weight-shared binary: a device does.", ""]
    for target, v in sorted(row["verify"].items()):
        for rt, how in v.get("runtimes", {}).items():
            lines.append(f"- {target}, {rt}: {how}.")
    lines += ["", "Context binaries as read back by libQnnSystem (bytes; *weights*: each graph's own, summed; "
              "*shared weights*: what the graphs of a weight-shared binary hold once between them):", "",
              "| target | binary | graphs | size | weights | shared weights | spill-fill | I/O | QNN SDK |",
              "|---|---|---|---|---|---|---|---|---|"]
    for target, v in sorted(row["verify"].items()):
        for rel, b in sorted(v.get("binaries", {}).items()):
            gs = b["graphs"].values()
            total = lambda k: sum(g[k] or 0 for g in gs)
            lines.append(f"| {target} | {rel} | {len(b['graphs'])} | {b['bytes']} | {total('weight_bytes')} | "
                         f"{max((g['shared_weight_bytes'] or 0 for g in gs), default=0)} | "
                         f"{max((g['spill_fill_bytes'] or 0 for g in gs), default=0)} | {total('io_bytes')} | "
                         f"{b['sdk_build_id']} |")
    lines += ["", "## Stage keys", "", "| stage | key |", "|---|---|",
              *(f"| {s} | `{k}` |" for s, k in row["stage_keys"].items()), "",
              "`manifest.json` lists the sha256 of every file; `doit check_bundle --path <folder>` checks them.", ""]
    return str(ModelCard("\n".join(lines)))


def build_manifest(session: Session, recipe_name: str, status: "catalog.RecipeStatus", files: dict[str, tuple[str, int]],
                   row: dict) -> dict:
    """manifest.json content. ``files``: {rel path: (sha256, size)} of every bundle file but
    manifest.json. Keys: schema_version, recipe, build_key, files {rel: {sha256, size}},
    resolved_recipe (Recipe.model_dump), stages {stage: {kind, key, output_digest, tools}},
    tools (all stages' tools merged), source (kind, repo, commit, package_version...),
    build_platform (system, machine, python of the compile/verify hosts), verify
    {target: {backend, runtime, metrics, thresholds}}, qnn_context_sdk, archive_mtime, not_recorded."""
    recipe = catalog.catalog_recipes(session)[recipe_name]
    ents = status.entries
    mtime, mfrom = archive_mtime(status)
    return {
        "schema_version": MANIFEST_SCHEMA, "recipe": recipe_name, "build_key": short_key(status),
        "files": {rel: {"sha256": h, "size": n} for rel, (h, n) in sorted(files.items())},
        "resolved_recipe": recipe.model_dump(mode="json"),
        "stages": {s: {"kind": e.kind, "key": e.key, "output_digest": e.output_digest,
                       "tools": e.manifest.get("tools", {})} for s, e in ents.items()},
        "tools": _merged_tools(ents), "source": row["source"], "build_platform": _build_platform(ents),
        "verify": {t: {k: v.get(k) for k in ("backend", "runtime", "metrics", "thresholds")}
                   for t, v in row["verify"].items()},
        "qnn_context_sdk": row["qnn_context_sdk"],
        "archive_mtime": {"seconds": mtime, "from": mfrom},
        "not_recorded": NOT_RECORDED,
    }


def _dumps(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def plan_bundle(recipe: str, session: Session | None = None) -> dict:
    """Everything publish writes, computed in memory (nothing written). Raises PublishError
    unless ``recipe`` is verified. Returns {"recipe", "short", "status", "files": {rel: Path
    (cache file) | bytes}, "manifest": dict, "folder": Path, "archive": Path, "mtime": int}.
    ``session``: the command's (default: a new one)."""
    session = session or Session()
    st = _verified_status(session, recipe)
    r = catalog.catalog_recipes(session)[recipe]
    row = catalog.catalog_row(recipe, r, session)
    short = short_key(st)
    files: dict = dict(bundle_sources(st))
    sums = shipped_digests(session, st, files)
    files["README.md"] = model_card(r, row, short).encode("utf-8")
    sums["README.md"] = (_sha256_bytes(files["README.md"]), len(files["README.md"]))
    manifest = build_manifest(session, recipe, st, sums, row)
    files["manifest.json"] = _dumps(manifest)
    dist = paths.dist_dir()
    return {"recipe": recipe, "short": short, "status": st, "files": dict(sorted(files.items())),
            "manifest": manifest, "folder": dist / recipe, "archive": dist / f"{recipe}-{short}.tar.gz",
            "mtime": manifest["archive_mtime"]["seconds"]}


# ------------------------------------------------------------ writing


def write_bundle(plan: dict, into: Path) -> Path:
    """Write ``plan["files"]`` into the new folder ``into`` (what was there is removed first).
    Returns it. Files are copied (not linked), so the cache's read-only bits do not follow."""
    if into.exists():
        shutil.rmtree(into)
    for rel, src in plan["files"].items():
        dest = into / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path):
            shutil.copyfile(src, dest)
        else:
            dest.write_bytes(src)
    return into


def write_archive(folder: Path, dest: Path, prefix: str, mtime: int) -> Path:
    """Deterministic ``.tar.gz`` of every file under ``folder``, as ``<prefix>/<rel>``:
    directory and file entries sorted by name, mtime ``mtime`` (seconds), uid/gid 0, empty
    uname/gname, mode 0755/0644, GNU format, gzip level 9 with header mtime 0 and no name.
    Written to a temp file and renamed (the temp file is removed if writing fails). Returns
    ``dest``."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    dirs = sorted({"/".join(r.split("/")[:i]) for r in rels for i in range(1, r.count("/") + 1)})
    entries = sorted([(d, True) for d in ["", *dirs]] + [(r, False) for r in rels])
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        _write_tar(folder, tmp, prefix, mtime, entries)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(dest)
    return dest


def _write_tar(folder: Path, tmp: Path, prefix: str, mtime: int, entries: list) -> None:
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for rel, is_dir in entries:
            ti = tarfile.TarInfo(f"{prefix}/{rel}".rstrip("/"))
            ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = mtime, 0, 0, "", ""
            if is_dir:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(ti)
            else:
                p = folder / rel
                ti.type, ti.mode, ti.size = tarfile.REGTYPE, 0o644, p.stat().st_size
                with open(p, "rb") as f:
                    tar.addfile(ti, f)


def _print_ops(plan: dict, dest, hub_repo) -> None:
    total = sum(len(v) if isinstance(v, bytes) else v.stat().st_size for v in plan["files"].values())
    print(f"[dry-run] would write {plan['folder']}/ ({len(plan['files'])} files, {total / 1e6:.1f} MB):")
    for rel, v in plan["files"].items():
        size = len(v) if isinstance(v, bytes) else v.stat().st_size
        print(f"[dry-run]   {rel} ({size} bytes)")
    got = plan["manifest"]["archive_mtime"]["from"]
    print(f"[dry-run] would write {plan['archive']} (every entry's mtime {plan['mtime']}: "
          + ("the source has no commit time; SOURCE_DATE_EPOCH sets one)" if got == "unknown (0)" else f"{got})"))
    if dest:
        print(f"[dry-run] would copy {plan['folder'].name}/ and {plan['archive'].name} to {Path(dest).absolute()}/")
    if hub_repo:
        for op in hub_operations(plan, hub_repo):
            print(f"[dry-run] would call HfApi.{op[0]}({', '.join(f'{k}={v!r}' for k, v in op[1].items())})")


def hub_operations(plan: dict, repo_id: str) -> list[tuple[str, dict]]:
    """The Hub calls publish makes, as [(HfApi method, kwargs)]; ``revision`` of create_tag
    is the commit upload_folder returns (shown as ``<commit of upload_folder>``)."""
    return [
        ("create_repo", {"repo_id": repo_id, "repo_type": "model", "exist_ok": True}),
        ("upload_folder", {"repo_id": repo_id, "repo_type": "model", "folder_path": str(plan["folder"]),
                           "commit_message": f"npubuild {plan['recipe']} build {plan['short']}"}),
        ("create_tag", {"repo_id": repo_id, "repo_type": "model", "tag": f"npubuild-{plan['short']}",
                        "revision": "<commit of upload_folder>", "exist_ok": True}),
    ]


def push_to_hub(plan: dict, repo_id: str, endpoint: str | None = None, token: str | None = None) -> dict:
    """Run :func:`hub_operations` with ``huggingface_hub.HfApi(endpoint, token)`` (defaults:
    ``HF_ENDPOINT``, ``HF_TOKEN`` / the stored login). Returns {"url", "commit", "tag"}.
    Raises PublishError (token scrubbed) when a call fails."""
    from huggingface_hub import HfApi

    from .proc.scrubbing import scrub

    api = HfApi(endpoint=endpoint, token=token)
    ops = hub_operations(plan, repo_id)
    try:
        url = api.create_repo(**ops[0][1])
        print(f"[publish:{plan['recipe']}] Hub repo {url}")
        info = api.upload_folder(**ops[1][1])
        commit = info.oid
        print(f"[publish:{plan['recipe']}] uploaded {len(plan['files'])} files, commit {commit}")
        tag = dict(ops[2][1], revision=commit)
        api.create_tag(**tag)
        print(f"[publish:{plan['recipe']}] tagged {tag['tag']}")
    except Exception as e:
        raise PublishError(scrub(f"Hub publishing to {repo_id!r} failed: {type(e).__name__}: {e}")) from None
    return {"url": str(url), "commit": commit, "tag": tag["tag"]}


def publish(recipe: str, dest: str | Path | None = None, hub_repo: str | None = None, dry_run: bool = False,
            endpoint: str | None = None, token: str | None = None, sign: str | Path | None = None,
            signing_cert: str | Path | None = None, cert_chain: list | None = None,
            session: Session | None = None) -> dict:
    """Publish a verified recipe: write ``dist/<recipe>/`` and ``dist/<recipe>-<short>.tar.gz``,
    then copy both to ``dest`` and/or push the bundle to Hub repo ``hub_repo``. With
    ``dry_run`` only print the operations. With ``sign`` (a PEM private key; with
    ``signing_cert`` and ``cert_chain`` for certificate signing) the folder is signed
    (:func:`sign_bundle`) after the archive is written, so the archive stays byte-reproducible;
    the signature is also written beside it as ``<archive>.sig`` (put it into the unpacked
    folder as :data:`SIGNATURE` to check it). Returns {"folder", "archive", "short",
    "signature"?, "hub"?}. Raises PublishError (not verified, stale, not built; a cache file
    that does not match its entry's manifest; signing failed; a failed target). ``session``:
    the command's (default: a new one)."""
    plan = plan_bundle(recipe, session)
    if dry_run:
        _print_ops(plan, dest, hub_repo)
        if sign:
            print(f"[dry-run] would sign {plan['folder']}/ with {sign} into {SIGNATURE} and {plan['archive'].name}.sig")
        return {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"], "dry_run": True}
    from . import outputs

    # the folder and the archive are written under temp names, then renamed into place together:
    # a full disk is one DiskFull line and leaves the previous bundle and archive whole
    folder, dist = plan["folder"], plan["folder"].parent
    tmp_folder, tmp_archive = folder.with_name(f".{folder.name}.tmp"), dist / f".{plan['archive'].name}.new"
    with outputs.full_disk_is(dist, f"the bundle of {recipe}", "NPUBUILD_DIST", [tmp_folder, tmp_archive]):
        dist.mkdir(parents=True, exist_ok=True)
        write_bundle(plan, tmp_folder)
        write_archive(tmp_folder, tmp_archive, recipe, plan["mtime"])
    if folder.exists():
        shutil.rmtree(folder)
    tmp_folder.replace(folder)
    tmp_archive.replace(plan["archive"])
    print(f"[publish:{recipe}] {plan['folder']} ({len(plan['files'])} files) and {plan['archive']} "
          f"(sha256 {sha256_file(plan['archive'])[:16]}...)")
    out = {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"]}
    sig_copy = plan["archive"].with_name(plan["archive"].name + ".sig")
    sig_copy.unlink(missing_ok=True)
    if sign:
        out["signature"] = sign_bundle(plan["folder"], sign, signing_cert, cert_chain)
        shutil.copyfile(out["signature"], sig_copy)
        print(f"[publish:{recipe}] signed with {sign}: {out['signature']} and {sig_copy}")
    if dest:
        d = Path(dest).absolute()
        d.mkdir(parents=True, exist_ok=True)
        if (d / recipe).exists():
            shutil.rmtree(d / recipe)
        shutil.copytree(plan["folder"], d / recipe)
        shutil.copyfile(plan["archive"], d / plan["archive"].name)
        if sign:
            shutil.copyfile(sig_copy, d / sig_copy.name)
        print(f"[publish:{recipe}] copied to {d}/")
        out["dest"] = d
    if hub_repo:
        out["hub"] = push_to_hub(plan, hub_repo, endpoint=endpoint, token=token)
    return out


# ------------------------------------------------------------ checking


MANIFEST_MAX_BYTES = 16 * 1024**2  # ~100,000 listed files; a larger manifest.json is refused unread
SIGNATURE = "npubuild.sig"  # the OpenSSF model-signing signature of a signed bundle (publish --sign)
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _found(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), type(v).__name__) + ("" if isinstance(v, (dict, list)) else f" {json.dumps(v)[:40]}")


def read_manifest(folder: str | Path) -> dict:
    """A bundle's ``manifest.json``, checked before use: at most :data:`MANIFEST_MAX_BYTES`
    (its size is checked before it is read), a JSON object whose ``files`` is an object
    {relative path: {"sha256": 64 hex, "size": int >= 0}}, no path absolute or with ``..``.
    Raises PublishError as ``<file>: <key path>: expected ..., found ...``."""
    f = Path(folder) / "manifest.json"
    try:
        size = f.stat().st_size
    except OSError as e:
        raise PublishError(f"{f}: expected a bundle manifest, found none ({e.strerror})") from None
    if size > MANIFEST_MAX_BYTES:
        raise PublishError(f"{f}: expected at most {MANIFEST_MAX_BYTES} bytes (MANIFEST_MAX_BYTES), found {size} "
                           f"bytes; not read")
    try:
        m = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise PublishError(f"{f}: expected UTF-8 JSON, found {type(e).__name__}: {e}") from None
    if not isinstance(m, dict):
        raise PublishError(f"{f}: expected a JSON object, found {_found(m)}")
    files = m.get("files")
    if not isinstance(files, dict):
        raise PublishError(f"{f}: files: expected an object {{relative path: {{sha256, size}}}}, "
                           f"found {'nothing' if 'files' not in m else _found(files)}")
    problems = []
    for rel, meta in files.items():
        p = Path(rel)
        if not rel or p.is_absolute() or ".." in p.parts or rel in ("manifest.json", SIGNATURE):
            problems.append(f"files.{rel}: expected a relative path inside the bundle (not manifest.json or "
                            f"{SIGNATURE}), found {json.dumps(rel)}")
        elif not isinstance(meta, dict):
            problems.append(f"files.{rel}: expected an object {{sha256, size}}, found {_found(meta)}")
        else:
            n, h = meta.get("size"), meta.get("sha256")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                problems.append(f"files.{rel}.size: expected an integer >= 0, found "
                                f"{'nothing' if 'size' not in meta else _found(n)}")
            if not (isinstance(h, str) and _SHA256.fullmatch(h)):
                problems.append(f"files.{rel}.sha256: expected 64 lowercase hex digits, found "
                                f"{'nothing' if 'sha256' not in meta else _found(h)}")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PublishError(f"{f}: " + "; ".join(problems[:5]) + more)
    return m


def check_bundle(folder: str | Path, public_key: str | Path | None = None,
                 cert_chain: list | None = None) -> dict[str, list[str]]:
    """Recompute the sha256 of every file of a bundle folder (full reads) against its
    manifest.json (:func:`read_manifest`). Returns {"mismatch": [rel: why], "missing": [rel],
    "extra": [rel]} (all empty = intact); manifest.json and the signature are not listed.
    When the bundle has a signature (:data:`SIGNATURE`) or a trust anchor is given
    (``public_key``: a PEM public key; ``cert_chain``: PEM CA certificates), the result also
    has "signature": [problems] (:func:`verify_signature`); a signature with nothing to check
    it against is a problem, since anyone can sign. Raises PublishError for a manifest that
    is absent, too large or malformed."""
    folder = Path(folder)
    listed = read_manifest(folder)["files"]
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json", SIGNATURE}
    out = {"mismatch": [], "missing": sorted(set(listed) - present), "extra": sorted(present - set(listed))}
    for rel in sorted(set(listed) & present):
        p, want = folder / rel, listed[rel]
        size = p.stat().st_size
        if size != want["size"]:
            out["mismatch"].append(f"{rel}: size {size} != {want['size']}")
        elif sha256_file(p) != want["sha256"]:
            out["mismatch"].append(f"{rel}: sha256 differs")
    if (folder / SIGNATURE).exists() or public_key or cert_chain:
        out["signature"] = verify_signature(folder, public_key, cert_chain)
    return out


def _hashing_config():
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[SIGNATURE])


def sign_bundle(folder: Path, private_key: str | Path, signing_cert: str | Path | None = None,
                cert_chain: list | None = None) -> Path:
    """Sign every file of bundle ``folder`` (manifest.json included) with OpenSSF
    ``model-signing`` into ``<folder>/``:data:`SIGNATURE` (a Sigstore bundle, DSSE over the
    in-toto statement of each file's sha256), with a PEM elliptic-curve private key, or with
    that key's ``signing_cert`` (+ ``cert_chain``). No network (no Sigstore Fulcio/Rekor).
    ECDSA signatures differ at each signing; the bundle's other files do not. Returns the
    signature's path. Raises PublishError naming the key file when signing fails."""
    from model_signing import signing

    cfg = signing.Config().set_hashing_config(_hashing_config())
    try:
        if signing_cert:
            cfg.use_certificate_signer(private_key=private_key, signing_certificate=signing_cert,
                                       certificate_chain=cert_chain or [])
        else:
            cfg.use_elliptic_key_signer(private_key=private_key)
        cfg.sign(folder, folder / SIGNATURE)
    except Exception as e:
        raise PublishError(f"{private_key}: cannot sign {folder} with it ({type(e).__name__}: {e})") from None
    return folder / SIGNATURE


def verify_signature(folder: str | Path, public_key: str | Path | None = None, cert_chain: list | None = None) -> list[str]:
    """Problems with bundle ``folder``'s signature (empty = it verifies): checked with
    ``model-signing`` against ``public_key`` (key-signed bundles) or ``cert_chain`` (PEM CA
    certificates, certificate-signed bundles); every file of the folder but the signature must
    be signed and unchanged, so a file changed together with its manifest entry fails. Without
    either, or without a signature, that is the problem reported."""
    from model_signing import verifying

    folder = Path(folder)
    sig = folder / SIGNATURE
    if not sig.exists():
        return [f"{SIGNATURE}: expected a signature (a key to check one was given), found none"]
    if not (public_key or cert_chain):
        return [f"{SIGNATURE}: expected --public-key or --cert-chain to check the signature against, found neither "
                f"(a signature anyone could have made proves nothing)"]
    cfg = verifying.Config().set_hashing_config(_hashing_config())
    if public_key:
        cfg.use_elliptic_key_verifier(public_key=public_key)
    else:
        cfg.use_certificate_verifier(certificate_chain=cert_chain)
    try:
        cfg.verify(folder, sig)
    except Exception as e:
        # model_signing raises ValueError("Signature mismatch: [<diff lines>]"), the list's repr
        changed = sorted(set(re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", str(e))))
        why = (f"files changed since signing: {', '.join(changed)}" if changed else
               f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
        return [f"{SIGNATURE}: does not verify against {public_key or ', '.join(map(str, cert_chain))}: {why}"]
    return []


def print_check(folder: str | Path, public_key: str | Path | None = None, cert_chain: list | None = None) -> bool:
    """:func:`check_bundle` with one line per problem; True when the bundle is intact (and its
    signature, if any, verifies). Raises PublishError when there is no bundle to check (no or
    a malformed manifest, a key without a signature): one message, not a problem count."""
    res = check_bundle(folder, public_key, cert_chain)
    n = len(read_manifest(folder)["files"])
    for what in ("mismatch", "missing", "extra", "signature"):
        for item in res.get(what, []):
            print(f"{what.upper()} {item}")
    bad = sum(len(v) for v in res.values())
    sig = "" if "signature" not in res else ", signature " + ("verified" if not res["signature"] else "NOT verified")
    print(f"{folder}: {n} files listed, {len(res['mismatch'])} mismatched, {len(res['missing'])} missing, "
          f"{len(res['extra'])} extra{sig}")
    return bad == 0


# ------------------------------------------------------------ reproducing


def recheck_published(session: Session, folder: Path, manifest: dict) -> None:
    """Before a published bundle is compared with a rebuild: re-read every file of it against
    its manifest (:func:`check_bundle`, full sha256), and fully rehash the local cache entries
    its artifacts came from (the manifest's ``stages`` of the kinds with artifacts; entries
    no longer in the cache are skipped), so that a difference is never blamed on the rebuild
    when the published side is damaged. A damaged entry is quarantined
    (``Cache.confirm_damage``). Raises PublishError naming the file, or the entry and file."""
    res = check_bundle(folder)
    bad = [f"{w} {item}" for w in ("mismatch", "missing", "extra") for item in res[w]]
    if bad:
        raise PublishError(f"{folder}: the published bundle does not match its manifest.json ({'; '.join(bad[:5])}); "
                           f"publish it again before comparing")
    cache = cache_of(session)
    for stage, st in sorted(manifest.get("stages", {}).items()):
        if not (isinstance(st, dict) and artifact_patterns(str(st.get("kind"))) and isinstance(st.get("key"), str)):
            continue
        probs = cache.problems(st["kind"], st["key"], full=True)
        if probs:
            moved = cache.confirm_damage(st["kind"], st["key"], probs)
            raise PublishError(f"{folder} was published from cache entry {st['kind']}/{st['key']} (stage {stage}), "
                               f"which is damaged: {'; '.join(probs[:3])}" + (f"; moved to {moved}" if moved else "")
                               + "; rebuild and publish again before comparing")


def reproduce(recipe: str, keep: bool = False, session: Session | None = None) -> bool:
    """Rebuild ``recipe`` from an empty temporary cache (``doit build:<recipe>`` then
    ``doit publish:<recipe>`` in subprocesses with NPUBUILD_CACHE/BUILD/HOME/DIST in a temp
    folder) and compare every published file (manifest.json and the archive included) with
    the existing ``dist/<recipe>/``, printing ``identical`` or ``DIFFERS`` per file.

    Returns True when everything is identical. The temp folder is removed unless something
    differs or ``keep``. Raises PublishError when there is no published bundle to compare
    with, when the recipe now resolves to something else than the published one (naming
    what changed: a rebuild would be another bundle), or when the rebuild fails. ``session``:
    the command's (default: a new one)."""
    session = session or Session()
    old = paths.dist_dir() / recipe
    if not (old / "manifest.json").exists():
        raise PublishError(f"no published bundle at {old} to compare with: run `doit publish:{recipe}` first")
    old_manifest = read_manifest(old)
    recheck_published(session, old, old_manifest)
    changed = diff(old_manifest.get("resolved_recipe"), catalog.catalog_recipes(session)[recipe].model_dump(mode="json"))
    if changed:  # a rebuild would be another bundle: say so, not "DIFFERS" per file (a tester)
        raise PublishError(f"{old / 'manifest.json'}: published (build {old_manifest.get('build_key')}) from another "
                           f"recipe than {recipe} resolves to now: {'; '.join(changed[:5])}"
                           f"{f' (and {len(changed) - 5} more)' if len(changed) > 5 else ''}; a rebuild would not "
                           f"be that bundle: restore the recipe to reproduce it, or `doit publish:{recipe}` to "
                           f"publish what it gives now")
    old_archive = paths.dist_dir() / f"{recipe}-{old_manifest['build_key']}.tar.gz"
    tmp = Path(tempfile.mkdtemp(prefix=f"npubuild-reproduce-{recipe}-"))
    env = dict(os.environ, NPUBUILD_ROOT=str(paths.root()), NPUBUILD_RECIPES=str(paths.recipes_dir()),
               NPUBUILD_CACHE=str(tmp / "cache"), NPUBUILD_BUILD=str(tmp / "build"),
               NPUBUILD_HOME=str(tmp / "home"), NPUBUILD_DIST=str(tmp / "dist"))
    env.pop("NPUBUILD_REMOTE", None)  # a rebuild from scratch, not a download
    dodo = Path(__file__).resolve().parent.parent / "dodo.py"
    for task in (f"build:{recipe}", f"publish:{recipe}"):
        print(f"[reproduce:{recipe}] doit {task} in {tmp}", flush=True)
        p = subprocess.run([sys.executable, "-m", "doit", "-f", str(dodo), "-d", str(paths.root()), task],
                           env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise PublishError(f"rebuild failed: doit {task} exited {p.returncode} (kept {tmp}):\n"
                               + (p.stdout + p.stderr)[-4000:])
    new = tmp / "dist" / recipe
    new_manifest = read_manifest(new)
    new_archive = tmp / "dist" / f"{recipe}-{new_manifest['build_key']}.tar.gz"
    pairs = [(rel, old_manifest["files"][rel]["sha256"], new / rel) for rel in sorted(old_manifest["files"])]
    pairs.append(("manifest.json", sha256_file(old / "manifest.json"), new / "manifest.json"))
    pairs.append((f"archive {old_archive.name}", sha256_file(old_archive) if old_archive.exists() else None,
                  new_archive))
    same = True
    for rel, want, path in pairs:
        got = sha256_file(path) if path.exists() else None
        if got is not None and got == want:
            print(f"identical  {rel}  {got[:16]}")
        else:
            same = False
            print(f"DIFFERS    {rel}  published {str(want)[:16]}  rebuilt {str(got)[:16]}")
            mine = old / rel if (old / rel).is_file() else (old_archive if rel.startswith("archive ") else None)
            if got is not None and mine is not None and mine.exists():
                r = differing_ranges(mine, path)
                print("           " + (r if isinstance(r, str) else "differing bytes: " + ", ".join(
                    f"{s0}..{e0 - 1} ({e0 - s0} B)" for s0, e0 in r)))
    old_v = {t: v["metrics"] for t, v in old_manifest.get("verify", {}).items()}
    new_v = {t: v["metrics"] for t, v in new_manifest.get("verify", {}).items()}
    print(f"verify metrics {'identical' if old_v == new_v else 'DIFFER'} (published vs rebuilt)")
    rekeyed = sorted(st for st, v in old_manifest.get("stages", {}).items()
                     if v.get("key") != new_manifest.get("stages", {}).get(st, {}).get("key"))
    if not same and rekeyed:
        print(f"stage keys that differ (their code, tools or data files changed since publishing): {', '.join(rekeyed)}")
    for rel in sorted(set(new_manifest["files"]) - set(old_manifest["files"])):
        same = False
        print(f"DIFFERS    {rel}  only in the rebuild")
    if same and not keep:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"[reproduce:{recipe}] byte-identical: {len(pairs)} files")
    else:
        print(f"[reproduce:{recipe}] {'differences found; ' if not same else ''}rebuild kept in {tmp}")
    return same
