"""A download entry holds a complete model folder only: a local Hugging Face cache snapshot that
lacks files (an interrupted download; huggingface_hub issue 3371) is one line naming them and
no entry, so once the snapshot is completed the same build succeeds; online, a file whose bytes
differ from the Hub's listing (size, sha256) is refused the same way. A stage that fails
reading an upstream entry names that entry and how to drop it. Through the real doit CLI, on
the tiny BERT (fake local Hub cache; offline, or a local stand-in of the Hub's model API)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import TINY_RECIPE, Project
from console_cli import doit as console
from hub_cache import COMMIT, fake_hub_cache

from tasks.store import digest

REPO = "acme/tiny-bert"
HF_RECIPE = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
    "source: {path: models/tiny-bert}", f"source: {{hf: {REPO}, revision: main}}"
)


def _snapshot(tmp_path, tiny_bert, leave_out: set[str]):
    """A fake Hub cache of REPO holding the tiny BERT's files but ``leave_out``; returns (hub
    root, snapshot folder)."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for f in tiny_bert.iterdir():
        if f.name not in leave_out:
            shutil.copyfile(f, partial / f.name)
    root = fake_hub_cache(tmp_path / "hub", REPO, partial)
    return root, root / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT


def _add(snapshot, src):
    """Put file ``src`` into the snapshot as huggingface_hub does: a blob and a link to it."""
    blob = snapshot.parent.parent / "blobs" / digest.sha256_file(src)
    shutil.copyfile(src, blob)
    (snapshot / src.name).symlink_to(f"../../blobs/{blob.name}")


def test_an_incomplete_snapshot_is_one_line_and_no_entry_then_builds_once_completed(tmp_path, tiny_bert):
    p = Project(tmp_path / "proj", tiny_bert)
    hub, snap = _snapshot(tmp_path, tiny_bert, {"model.safetensors"})
    p.env["HF_HUB_CACHE"] = str(hub)
    p.recipe("r", HF_RECIPE)
    run = console(p, "run", "build:r")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out
    assert p.entries("download") == [] and p.entries("export") == []
    lines = [ln for ln in out.splitlines() if ln.startswith("download:r  SourceError")]
    assert lines == [
        f"download:r  SourceError: Hub model '{REPO}' at commit {COMMIT}: the local Hugging Face "
        f"cache's snapshot {snap} is incomplete, missing 1 file: model.safetensors (the weights; or "
        f"model.safetensors.index.json and its shards); nothing was cached: fetch it with the Hub "
        f"reachable (`hf download {REPO} --revision {COMMIT}`) and build again"
    ]
    _add(snap, tiny_bert / "model.safetensors")
    run = p.doit("run", "build:r")
    assert run.ran() == ["compile:r", "download:r", "export:r", "prepatch:r", "quantize:r", "verify:r"]
    assert len(p.entries("download")) == 1 and (p.root / "build" / "r" / "model_ctx.onnx").is_file()


def test_format_missing_names_each_missing_file(tmp_path):
    """Offline, what the model format needs: config, weights (one file or the index and every
    shard it names), a tokenizer, and each file a recipe pattern names literally."""
    import json

    from tasks.sources.hub_files import format_missing

    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    names = {"model.safetensors.index.json", "model-00001-of-00002.safetensors", "vocab.json"}
    assert format_missing(tmp_path, names, ["*.json", "generation_config.json"]) == [
        "config.json",
        "generation_config.json",
        "model-00002-of-00002.safetensors (a shard model.safetensors.index.json names)",
        "tokenizer.json (or tokenizer.model, vocab.txt, or vocab.json and merges.txt)",
    ]
    assert format_missing(tmp_path, names | {"config.json", "merges.txt", "model-00002-of-00002.safetensors"}) == []


def test_a_stage_failing_on_an_upstream_entry_names_it_and_how_to_drop_it(tmp_path, tiny_bert, monkeypatch):
    """A download entry without weights (as builds before the completeness check could leave):
    export fails in one line naming the entry, and the command to drop it; once dropped, the
    build succeeds."""
    from tasks.core.resolve import Resolver
    from tasks.core.session import Session

    p = Project(tmp_path / "proj", tiny_bert)
    p.recipe("r")
    for k in ("NPUBUILD_ROOT", "NPUBUILD_CACHE", "NPUBUILD_BUILD", "NPUBUILD_HOME"):
        monkeypatch.setenv(k, p.env[k])
    res = Resolver(Session(), "r", pull=False)
    key = res.key("download")
    src = p.root / "models" / "tiny-bert"

    def without_weights(out):
        for f in src.iterdir():
            if f.name != "model.safetensors":
                shutil.copyfile(f, out / f.name)
        return {}

    res.cache.get_or_build("download", key, {"material": res.material("download")}, without_weights)
    entry = p.cache / "download" / key
    run = console(p, "run", "build:r")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out
    line = next(ln for ln in out.splitlines() if ln.startswith("export:r  UpstreamUnusable"))
    assert line.startswith(
        f"export:r  UpstreamUnusable: upstream entry download/{key} ({entry}), built by "
        f"download:r, cannot be used [OSError: "
    )
    assert line.endswith(f"]: drop it (`rm -rf {entry}`) and build again; download:r rebuilds it")
    shutil.rmtree(entry)
    assert p.doit("run", "build:r").ran() == [
        "compile:r",
        "download:r",
        "export:r",
        "prepatch:r",
        "quantize:r",
        "verify:r",
    ]


class _HubListing(BaseHTTPRequestHandler):
    """The Hub's model API as huggingface_hub reads it for a download: GET
    /api/models/<repo>/revision/<rev> (``model_info``; with ``?blobs=true`` the files' sizes,
    git blob ids and LFS sha256). ``server.files``: {name: bytes} as the Hub has them."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        path, _, query = self.path.partition("?")
        self.server.calls.append(self.path)
        if not path.startswith(f"/api/models/{REPO}/revision/"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        siblings = []
        for name, data in sorted(self.server.files.items()):
            row = {"rfilename": name}
            if "blobs=true" in query.lower():
                row.update(size=len(data), blobId=hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
                if name.endswith(".safetensors"):
                    row["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(row)
        body = json.dumps(
            {
                "id": REPO,
                "modelId": REPO,
                "sha": COMMIT,
                "siblings": siblings,
                "private": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_online_a_snapshot_file_that_differs_from_the_hubs_listing_is_one_line_and_no_entry(tmp_path, tiny_bert):
    """Online, huggingface_hub takes a file of a commit that is in its cache as it is (no
    request): a blob damaged in place (same size) is caught against the Hub's sha256."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _HubListing)
    srv.files, srv.calls = {f.name: f.read_bytes() for f in tiny_bert.iterdir()}, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        p = Project(tmp_path / "proj", tiny_bert)
        hub, snap = _snapshot(tmp_path, tiny_bert, set())
        blob = (snap / "model.safetensors").resolve()
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0xFF
        blob.write_bytes(bytes(data))
        p.env.update(
            HF_HUB_CACHE=str(hub),
            HF_HUB_OFFLINE="0",
            HF_ENDPOINT=f"http://127.0.0.1:{srv.server_port}",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            HF_HUB_DISABLE_TELEMETRY="1",
        )
        p.recipe("r", HF_RECIPE)
        run = console(p, "run", "download:r")
        out = run.stdout + run.stderr
        assert run.returncode != 0 and "Traceback" not in out, out
        assert p.entries("download") == []
        want = hashlib.sha256(srv.files["model.safetensors"]).hexdigest()
        assert [ln for ln in out.splitlines() if ln.startswith("download:r  SourceError")] == [
            f"download:r  SourceError: Hub model '{REPO}' at commit {COMMIT}: the snapshot {snap} differs from the "
            f"Hub's file listing in 1 file: model.safetensors (sha256 {hashlib.sha256(data).hexdigest()}, the Hub "
            f"lists {want}); nothing was cached: download it again (`hf download {REPO} --revision {COMMIT} "
            f"--force-download`) and build again"
        ], out
        assert any("blobs=" in c for c in srv.calls), srv.calls
        blob.write_bytes(srv.files["model.safetensors"])  # repaired: the same build succeeds
        assert console(p, "run", "download:r").returncode == 0 and len(p.entries("download")) == 1
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_local_source_folder_that_is_not_a_model_is_one_line_and_no_entry(project):
    """A ``source.path`` folder that is empty, or holds only links that point nowhere (a Hub
    ``snapshots/<rev>/`` folder copied without its ``blobs/``), or lacks its weights: one line
    naming what is missing, no download entry (it was cached as an empty entry, and export
    failed with transformers' 3 KB message)."""
    import os

    folder = project.root / "models" / "x"
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        os.symlink(project.root / "blobs" / name, folder / name)  # dangling
    recipe = project.recipe("x")
    recipe.write_text(recipe.read_text().replace("models/tiny-bert", "models/x"))
    run = project.doit("run", "build:x", check=False)
    assert run.code != 0
    lines = [ln for ln in run.log().splitlines() if "expected a complete model folder" in ln]
    assert len(lines) == 1 and "config.json" in lines[0] and "model.safetensors" in lines[0], run.log()
    assert project.entries("download") == []
