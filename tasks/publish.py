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
that name). Two builds from *empty* caches agree on every file except, in some runs, the context binary
(126 padding bytes) and the files that name its digest: :data:`KNOWN_VARIABLE` says why.
Graphs with external data (> 2 GB) are not checked yet.

Targets: ``dest`` (a folder: the bundle is copied to ``<dest>/<recipe>/`` and the archive
to ``<dest>/``) and ``hub_repo`` (a Hugging Face Hub model repo: ``create_repo(exist_ok=True)``,
``upload_folder`` of the bundle, ``create_tag("npubuild-<short key>")`` on that commit).
``dry_run`` prints every operation and writes nothing at all (not even ``dist/``).

Also :func:`check_bundle` (sha256 of every file against manifest.json: mismatches, missing
and extra files) and :func:`reproduce` (rebuild from an empty temporary cache and compare).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from fnmatch import fnmatch
from pathlib import Path

from . import catalog, digest, paths
from .stages import ARTIFACTS

MANIFEST_SCHEMA = 1
NOT_RECORDED = {
    "host.platform": "kernel release and libc of the build host (varies with host updates; artifacts do not)",
    "hostname, user, absolute paths": "never recorded: they name the machine, not the build",
    "timings": "build durations and finish times of the cache entries",
    "mtime_ns, xxh3": "cache-internal file stamps; the bundle lists sha256 and size instead",
    "built_for": "the recipe that first built a shared cache entry (depends on build order)",
}


# Files a rebuild from an empty cache is known not to reproduce byte for byte; reproduce()
# still reports them as DIFFERS (and fails) but names the cause. Measured with onnxruntime
# 1.32 + onnxruntime-qnn 2.7.0 (QNN SDK 2.51) on minilm-l6-w8a16 and the tiny test BERT.
KNOWN_VARIABLE: dict[str, str] = {
    "*_ctx_qnn.bin": "the QNN SDK writes one 126-byte padding run as 0x00 in some processes and 0xff in "
                     "others, for the same QDQ model, compile options and relative paths; which one depends "
                     "on the process (its folder, its environment), not on the inputs, and MALLOC_PERTURB_ "
                     "does not pin it. Everything else in the binary, and the EPContext model, reproduce",
    "manifest.json": "derived: lists the binary's sha256 and the verify key, whose inputs include the "
                     "compile output digest",
    "README.md": "derived: the model card names the build key and the stage keys",
    "*.tar.gz": "derived: contains the files above",
}


def known_variable(name: str) -> str | None:
    """Why file ``name`` (a bundle path or archive name) is known not to be reproducible, or None."""
    base = Path(name).name
    for pat, why in KNOWN_VARIABLE.items():
        if fnmatch(base, pat):
            return why
    return None


class PublishError(Exception):
    """The recipe cannot be published (not verified, stale, not built) or a target failed."""


sha256_file = digest.sha256_file


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------ what goes in the bundle


def _verified_status(recipe: str) -> dict:
    """The catalog status of ``recipe``; raises PublishError unless it is ``verified``."""
    recipes = catalog.catalog_recipes()
    if recipe not in recipes:
        raise PublishError(f"refusing to publish {recipe!r}: no such (non-abstract) recipe; "
                           f"known: {', '.join(recipes)}")
    st = catalog.recipe_status(recipe)
    if st["state"] == "verify-failed":
        raise PublishError(f"refusing to publish {recipe}: its verify failed:\n  " + "\n  ".join(st["failures"]))
    if st["state"] == "stale":
        raise PublishError(f"refusing to publish {recipe}: its build is stale ({st['reason']}); the recipe or a "
                           f"tool changed since it was built. Run `doit build:{recipe}` first "
                           f"(`doit explain:{recipe}` shows what changed).")
    if st["state"] == "not-built":
        raise PublishError(f"refusing to publish {recipe}: it is not built ({st['reason']}). "
                           f"Run `doit build:{recipe}` first.")
    return st


def short_key(status: dict) -> str:
    """12 hex: the verify stage key's start; with several verify stages, the start of the
    xxh3 of their sorted keys. ``status`` comes from :func:`catalog.recipe_status`."""
    keys = sorted(k for s, k in status["stage_keys"].items()
                  if status["resolver"].specs[s].kind == "verify")
    return keys[0][:12] if len(keys) == 1 else digest.digest_json(keys)[:12]


def bundle_sources(status: dict) -> dict[str, Path]:
    """{bundle-relative POSIX path: cache file} of the artifacts (``tasks.stages.ARTIFACTS``):
    EPContext models and context binaries, tokenizer and config files, ``verify.json``."""
    res = status["resolver"]
    many = sum(1 for s in res.specs.values() if s.kind == "compile") > 1
    out: dict[str, Path] = {}
    for stage, spec in res.specs.items():
        pats = ARTIFACTS.get(spec.kind)
        if not pats:
            continue
        e = status["entries"][stage]
        sub = spec.params["target"] + "/" if spec.kind in ("compile", "verify") and many else ""
        for rel in sorted(e.manifest["outputs"]):
            if spec.kind == "export" and "/" in rel:
                continue  # graphs live in sub-folders for LLMs; only top-level tokenizer/config files
            if any(fnmatch(Path(rel).name, p) for p in pats):
                out[sub + rel] = e.out / rel
    return dict(sorted(out.items()))


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


def source_commit_time(status: dict) -> int | None:
    """Seconds since the epoch of the source commit, when the download entry recorded one
    (``info.commit_time``); None otherwise (package and path sources have no commit, and the
    download stage does not ask the Hub for commit times)."""
    t = status["entries"]["download"].manifest.get("info", {}).get("commit_time")
    return int(t) if t is not None else None


def archive_mtime(status: dict) -> tuple[int, str]:
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
        tags=["onnx", "qnn", "qualcomm", "npu", "npubuild", recipe.quantize.precision, *recipe.compile.targets])
    if src["kind"] == "hf":
        origin = f"[{src['repo']}](https://huggingface.co/{src['repo']}) at commit `{src.get('commit')}`"
    elif src["kind"] == "package":
        origin = f"the Python package `{src['package']}` {src.get('package_version', '')} (folder `{src.get('subdir', '')}`)"
    else:
        origin = f"the local folder `{src['path']}` (content xxh3 `{src.get('content_digest')}`)"
    lines = [
        "---", data.to_yaml(), "---", "", f"# {recipe.name}", "", recipe.description or "", "",
        f"Built by npubuild from {origin}, quantized {recipe.quantize.precision} and compiled to QNN context "
        f"binaries for {', '.join(recipe.compile.targets)} (onnxruntime QNN EP, EPContext models). "
        f"Build key `{short}`. License: {recipe.license}.", "",
        "| | |", "|---|---|",
        f"| architecture | {catalog._arch(row)} |", f"| parameters | {row['parameters']} |",
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
    lines += ["", "## Stage keys", "", "| stage | key |", "|---|---|",
              *(f"| {s} | `{k}` |" for s, k in row["stage_keys"].items()), "",
              "`manifest.json` lists the sha256 of every file; `doit check_bundle --path <folder>` checks them.", ""]
    return str(ModelCard("\n".join(lines)))


def build_manifest(recipe_name: str, status: dict, files: dict[str, tuple[str, int]], row: dict) -> dict:
    """manifest.json content. ``files``: {rel path: (sha256, size)} of every bundle file but
    manifest.json. Keys: schema_version, recipe, build_key, files {rel: {sha256, size}},
    resolved_recipe (Recipe.model_dump), stages {stage: {kind, key, output_digest, tools}},
    tools (all stages' tools merged), source (kind, repo, commit, package_version...),
    build_platform (system, machine, python of the compile/verify hosts), verify
    {target: {backend, runtime, metrics, thresholds}}, qnn_context_sdk, archive_mtime, not_recorded."""
    recipe = catalog.catalog_recipes()[recipe_name]
    ents = status["entries"]
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


def plan_bundle(recipe: str) -> dict:
    """Everything publish writes, computed in memory (nothing written). Raises PublishError
    unless ``recipe`` is verified. Returns {"recipe", "short", "status", "files": {rel: Path
    (cache file) | bytes}, "manifest": dict, "folder": Path, "archive": Path, "mtime": int}."""
    st = _verified_status(recipe)
    r = catalog.catalog_recipes()[recipe]
    row = catalog.catalog_row(recipe, r)
    short = short_key(st)
    files: dict = dict(bundle_sources(st))
    files["README.md"] = model_card(r, row, short).encode("utf-8")
    sums = {rel: (sha256_file(v), v.stat().st_size) if isinstance(v, Path) else (_sha256_bytes(v), len(v))
            for rel, v in files.items()}
    manifest = build_manifest(recipe, st, sums, row)
    files["manifest.json"] = _dumps(manifest)
    dist = paths.dist_dir()
    return {"recipe": recipe, "short": short, "status": st, "files": dict(sorted(files.items())),
            "manifest": manifest, "folder": dist / recipe, "archive": dist / f"{recipe}-{short}.tar.gz",
            "mtime": manifest["archive_mtime"]["seconds"]}


# ------------------------------------------------------------ writing


def write_bundle(plan: dict) -> Path:
    """Write ``plan["files"]`` into ``plan["folder"]`` (replacing what was there). Returns
    the folder. Files are copied (not linked), so the cache's read-only bits do not follow."""
    folder = plan["folder"]
    tmp = folder.with_name(f".{folder.name}.tmp")
    for d in (tmp,):
        if d.exists():
            shutil.rmtree(d)
    for rel, src in plan["files"].items():
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(src, Path):
            shutil.copyfile(src, dest)
        else:
            dest.write_bytes(src)
    if folder.exists():
        shutil.rmtree(folder)
    tmp.replace(folder)
    return folder


def write_archive(folder: Path, dest: Path, prefix: str, mtime: int) -> Path:
    """Deterministic ``.tar.gz`` of every file under ``folder``, as ``<prefix>/<rel>``:
    directory and file entries sorted by name, mtime ``mtime`` (seconds), uid/gid 0, empty
    uname/gname, mode 0755/0644, GNU format, gzip level 9 with header mtime 0 and no name.
    Written to a temp file and renamed. Returns ``dest``."""
    rels = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    dirs = sorted({"/".join(r.split("/")[:i]) for r in rels for i in range(1, r.count("/") + 1)})
    entries = sorted([(d, True) for d in ["", *dirs]] + [(r, False) for r in rels])
    tmp = dest.with_name(f".{dest.name}.tmp")
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
    tmp.replace(dest)
    return dest


def _print_ops(plan: dict, dest, hub_repo) -> None:
    total = sum(len(v) if isinstance(v, bytes) else v.stat().st_size for v in plan["files"].values())
    print(f"[dry-run] would write {plan['folder']}/ ({len(plan['files'])} files, {total / 1e6:.1f} MB):")
    for rel, v in plan["files"].items():
        size = len(v) if isinstance(v, bytes) else v.stat().st_size
        print(f"[dry-run]   {rel} ({size} bytes)")
    print(f"[dry-run] would write {plan['archive']} (entry mtime {plan['mtime']}, "
          f"{plan['manifest']['archive_mtime']['from']})")
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

    from .stages.download import scrub

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
            endpoint: str | None = None, token: str | None = None) -> dict:
    """Publish a verified recipe: write ``dist/<recipe>/`` and ``dist/<recipe>-<short>.tar.gz``,
    then copy both to ``dest`` and/or push the bundle to Hub repo ``hub_repo``. With
    ``dry_run`` only print the operations. Returns {"folder", "archive", "short", "hub"?}.
    Raises PublishError (not verified, stale, not built; a failed target)."""
    plan = plan_bundle(recipe)
    if dry_run:
        _print_ops(plan, dest, hub_repo)
        return {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"], "dry_run": True}
    plan["folder"].parent.mkdir(parents=True, exist_ok=True)
    write_bundle(plan)
    write_archive(plan["folder"], plan["archive"], recipe, plan["mtime"])
    print(f"[publish:{recipe}] {plan['folder']} ({len(plan['files'])} files) and {plan['archive']} "
          f"(sha256 {sha256_file(plan['archive'])[:16]}...)")
    out = {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"]}
    if dest:
        d = Path(dest).absolute()
        d.mkdir(parents=True, exist_ok=True)
        if (d / recipe).exists():
            shutil.rmtree(d / recipe)
        shutil.copytree(plan["folder"], d / recipe)
        shutil.copyfile(plan["archive"], d / plan["archive"].name)
        print(f"[publish:{recipe}] copied to {d}/")
        out["dest"] = d
    if hub_repo:
        out["hub"] = push_to_hub(plan, hub_repo, endpoint=endpoint, token=token)
    return out


# ------------------------------------------------------------ checking


def check_bundle(folder: str | Path) -> dict[str, list[str]]:
    """Recompute the sha256 of every file of a bundle folder against its manifest.json.
    Returns {"mismatch": [rel: why], "missing": [rel], "extra": [rel]} (all empty = intact);
    manifest.json itself is not listed. Raises PublishError when manifest.json is absent or
    unreadable."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        listed = manifest["files"]
    except (OSError, ValueError, KeyError) as e:
        raise PublishError(f"{folder}: no readable manifest.json ({type(e).__name__}: {e})") from None
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    out = {"mismatch": [], "missing": sorted(set(listed) - present), "extra": sorted(present - set(listed))}
    for rel in sorted(set(listed) & present):
        p, want = folder / rel, listed[rel]
        size = p.stat().st_size
        if size != want["size"]:
            out["mismatch"].append(f"{rel}: size {size} != {want['size']}")
        elif sha256_file(p) != want["sha256"]:
            out["mismatch"].append(f"{rel}: sha256 differs")
    return out


def print_check(folder: str | Path) -> bool:
    """:func:`check_bundle` with one line per problem; True when the bundle is intact."""
    try:
        res = check_bundle(folder)
    except PublishError as e:
        print(e)
        return False
    for what in ("mismatch", "missing", "extra"):
        for item in res[what]:
            print(f"{what.upper()} {item}")
    n = len(json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))["files"])
    bad = sum(len(v) for v in res.values())
    print(f"{folder}: {n} files listed, {len(res['mismatch'])} mismatched, {len(res['missing'])} missing, "
          f"{len(res['extra'])} extra")
    return bad == 0


# ------------------------------------------------------------ reproducing


def reproduce(recipe: str, keep: bool = False) -> bool:
    """Rebuild ``recipe`` from an empty temporary cache (``doit build:<recipe>`` then
    ``doit publish:<recipe>`` in subprocesses with NPUBUILD_CACHE/BUILD/HOME/DIST in a temp
    folder) and compare every published file (manifest.json and the archive included) with
    the existing ``dist/<recipe>/``, printing ``identical`` or ``DIFFERS`` per file.

    Returns True when everything is identical. The temp folder is removed unless something
    differs or ``keep``. Raises PublishError when there is no published bundle to compare
    with, or when the rebuild fails."""
    old = paths.dist_dir() / recipe
    try:
        old_manifest = json.loads((old / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise PublishError(f"no published bundle at {old} to compare with: run `doit publish:{recipe}` first") from None
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
    new_manifest = json.loads((new / "manifest.json").read_text(encoding="utf-8"))
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
            why = known_variable(rel.split()[-1])
            print(f"DIFFERS    {rel}  published {str(want)[:16]}  rebuilt {str(got)[:16]}"
                  + (f"  (known: {why})" if why else ""))
    old_v = {t: v["metrics"] for t, v in old_manifest.get("verify", {}).items()}
    new_v = {t: v["metrics"] for t, v in new_manifest.get("verify", {}).items()}
    print(f"verify metrics {'identical' if old_v == new_v else 'DIFFER'} (published vs rebuilt)")
    for rel in sorted(set(new_manifest["files"]) - set(old_manifest["files"])):
        same = False
        print(f"DIFFERS    {rel}  only in the rebuild")
    if same and not keep:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"[reproduce:{recipe}] byte-identical: {len(pairs)} files")
    else:
        print(f"[reproduce:{recipe}] {'differences found; ' if not same else ''}rebuild kept in {tmp}")
    return same
