"""Cluster builds on a real Dask cluster (issue 10): ``dask scheduler`` and ``dask worker``
processes on 127.0.0.1 (tests/dask_servers.py), each worker with its own local cache
(NPUBUILD_CACHE) and one shared ``file://`` remote, driven through the real ``doit cluster``."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import REPO, Project
from dask_servers import GiB, DaskCluster
from remote_contents import build_files, remote_fs, remote_manifests

# 3 recipes sharing stages: download, export and prepatch are common to all; r8x shares r8's
# quantize, compile@x-elite and verify@x-elite (thresholds are not in the key): 11 distinct keys
RECIPES = {"r8": {}, "r4": {"precision": "w4a16"}, "r8x": {"targets": "[x-elite, 8gen3]"}}
DISTINCT = 11
INSTANCES = 6 + 6 + 8


def _recipes(p: Project) -> None:
    for name, fmt in RECIPES.items():
        p.recipe(name, **fmt)
    r8x = p.root / "recipes" / "r8x.yaml"
    r8x.write_text(r8x.read_text().replace("pooled_cosine_mean: 0.9", "pooled_cosine_mean: 0.8"))


def _worker_env(p: Project, name: str, url: str, tmp: Path, pythonpath: Path = REPO) -> dict:
    d = tmp / f"worker-{name}"
    return dict(
        p.env,
        NPUBUILD_CACHE=str(d / "cache"),
        NPUBUILD_HOME=str(d / "home"),
        NPUBUILD_BUILD=str(d / "build"),
        NPUBUILD_REMOTE=url,
        PYTHONPATH=str(pythonpath),
    )


@pytest.fixture
def cluster(tmp_path):
    c = DaskCluster(tmp_path / "dask")
    yield c
    c.stop()


def _cluster_run(p: Project, cluster: DaskCluster, *recipes: str, check: bool = True):
    run = p.doit("run", "cluster", "--scheduler", cluster.address, *recipes, check=check)
    return run, run.log()


def _same_build(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    """Assert two build/<recipe>/ folders are byte-identical, every file (issue 12: no excused
    context-binary padding; tasks/qnn/ep.py compile_settled)."""
    assert set(a) == set(b)
    assert [rel for rel in sorted(a) if a[rel] != b[rel]] == []


def test_two_workers_build_each_stage_once(tmp_path, tiny_bert, cluster):
    url = (tmp_path / "remote").as_uri()
    client = Project(tmp_path / "client", tiny_bert)
    local = Project(tmp_path / "local", tiny_bert)
    for p in (client, local):
        _recipes(p)
    client.env["NPUBUILD_REMOTE"] = url
    a = cluster.add_worker("A", _worker_env(client, "A", url, tmp_path), memory=3 * GiB)
    b = cluster.add_worker("B", _worker_env(client, "B", url, tmp_path), memory=3 * GiB)
    # offers less MEMORY than any stage asks (2 GiB for an encoder's): gets no stage
    small = cluster.add_worker("S", _worker_env(client, "S", url, tmp_path), memory=1 * GiB)

    t0 = time.time()
    run, out = _cluster_run(client, cluster)
    cluster_s = time.time() - t0
    assert f"{INSTANCES} stages of 3 recipe(s): {DISTINCT} distinct stage(s) to build" in out, out
    # the client pulled what build/ and the verify checks read: export, 3 compile, 3 verify
    assert f"submitted {DISTINCT}, built {DISTINCT}, reused 0, on_remote 0, pulled 7" in out, out
    assert [client.entries(k) for k in ("download", "patch", "quantize")] == [[], [], []]
    assert [len(client.entries(k)) for k in ("export", "compile", "verify")] == [1, 3, 3]
    # each key built exactly once across the cluster, by the workers (their logs and the
    # builder each remote manifest names), and the client built nothing
    built = a.built() + b.built()
    assert len(built) == len(set(built)) == DISTINCT, (a.log(), b.log())
    # which worker takes which stage is Dask's choice (work stealing, start-up order): one worker
    # building everything is a valid schedule (seen in CI), so the split is printed, not asserted
    print(f"worker A built {len(a.built())}, worker B built {len(b.built())} of {DISTINCT}")
    assert small.started() == [] and "npubuild-cluster" not in small.log()
    remote = remote_manifests(url)
    assert sorted(remote) == sorted(built)
    by = {k: json.loads(m)["builder"]["name"] for k, m in remote.items()}
    assert {k: ("A" if k in a.built() else "B") for k in built} == by
    assert " building " not in out
    for kind in ("download", "export", "patch", "quantize", "compile", "verify"):
        for key in client.entries(kind):
            m = json.loads((client.cache / kind / key / "manifest.json").read_text())
            assert m["remote"]["pulled_from"] == url and m["builder"]["name"] in ("A", "B")
    # the client's doit sees every stage up to date (pulling the intermediate entries): 0 stages run
    again = client.doit("run", *(f"build:{r}" for r in RECIPES))
    assert again.ran() == [], again.log()

    # the same recipes built by one local process: byte-identical build/ folders
    t0 = time.time()
    alone = local.doit("run", *(f"build:{r}" for r in RECIPES))
    local_s = time.time() - t0
    assert len(alone.ran()) == DISTINCT  # a stage shared with an earlier recipe is up to date
    for r in RECIPES:
        _same_build(build_files(client, r), build_files(local, r))
    files = build_files(client, "r8x")
    assert len(files) == 12 and {f"{t}/model_ctx_qnn.bin" for t in ("x-elite", "8gen3")} <= set(files), sorted(files)
    print(f"cluster {cluster_s:.1f}s (2 workers) vs local {local_s:.1f}s")

    # a second cluster run: everything is on the remote, nothing is submitted
    run2, out2 = _cluster_run(client, cluster, "r8", "r4")
    assert "12 stages of 2 recipe(s): 0 distinct stage(s) to build" in out2
    assert "submitted 0, built 0, reused 0, on_remote 9, pulled 0" in out2, out2
    assert a.built() + b.built() == built


def test_worker_with_other_code_refuses(tmp_path, tiny_bert, cluster):
    """A worker whose tasks/encoder/export.py differs (a copy of the package with one edited
    line, first on its PYTHONPATH) refuses the export stage, naming the module and both digests."""
    from tasks.core import keys
    from tasks.core.session import Session
    from tasks.recipe.plan import StageSpec

    url = (tmp_path / "remote").as_uri()
    client = Project(tmp_path / "client", tiny_bert)
    client.recipe("r8")
    client.env["NPUBUILD_REMOTE"] = url
    copy = tmp_path / "edited"
    shutil.copytree(REPO / "tasks", copy / "tasks", ignore=shutil.ignore_patterns("__pycache__"))
    f = copy / "tasks" / "encoder" / "export.py"
    f.write_text(f.read_text() + "\n# edited on this worker\n")
    from tasks.store import digest

    ours, theirs = digest.hash_file_uncached(REPO / "tasks" / "encoder" / "export.py"), digest.hash_file_uncached(f)
    cluster.add_worker("E", _worker_env(client, "E", url, tmp_path, pythonpath=copy))

    run, out = _cluster_run(client, cluster, check=False)
    assert run.code != 0
    assert (
        "worker E (tcp://127.0.0.1:" in out and "refuses export:r8 (export): its outputs would have other keys" in out
    ), out
    assert f"modules: tasks.encoder.export {ours} (client) vs {theirs} (worker)" in out, out
    digest = keys.code_digest(Session(), StageSpec("r8", "export", "export", {}, family="encoder"))
    assert f"code digest differs: {digest} (client)" in out
    # the download stage (its code is the same) was built and pushed; nothing else
    assert sorted(k.split("/")[0] for k in remote_manifests(url)) == ["download"]
    assert not (client.root / "build" / "r8").exists()


def test_killed_worker_mid_push(tmp_path, tiny_bert, cluster):
    """Worker A is killed (SIGKILL) while it uploads the first stage's files to the remote (a
    sitecustomize on its PYTHONPATH makes fsspec's put_file sleep after each file, so the kill
    lands there): its data folder stays without manifest, invisible; Dask reruns the stage on
    worker B, which builds it, pushes it, and the build completes."""
    from tasks.core.keys import remote_key
    from tasks.store.remote import Remote

    url = (tmp_path / "remote").as_uri()
    client = Project(tmp_path / "client", tiny_bert)
    client.recipe("r8")
    client.env["NPUBUILD_REMOTE"] = url
    slow = tmp_path / "slow"
    slow.mkdir()
    marker = tmp_path / "pushing"
    (slow / "sitecustomize.py").write_text(
        "import os, time\n"
        "from fsspec.implementations.local import LocalFileSystem\n"
        "_put = LocalFileSystem.put_file\n"
        "def put_file(self, lpath, rpath, *a, **kw):\n"
        "    _put(self, lpath, rpath, *a, **kw)\n"
        f"    open({str(marker)!r}, 'a').write(rpath + '\\n')\n"
        "    time.sleep(30)\n"
        "LocalFileSystem.put_file = put_file\n"
    )
    a = cluster.add_worker("A", _worker_env(client, "A", url, tmp_path, pythonpath=f"{slow}{os.pathsep}{REPO}"))
    proc = client.popen("run", "cluster", "--scheduler", cluster.address)
    deadline = time.time() + 60
    while not marker.exists():
        assert time.time() < deadline and proc.poll() is None, (
            proc.stdout.read() if proc.poll() is not None else a.log()
        )
        time.sleep(0.05)
    a.kill()
    first = marker.read_text().split()[0]
    rroot = Path(url[len("file://") :])
    kind, key, data = Path(first).relative_to(rroot).parts[:3]
    # A's partial upload: a file in its data folder, no manifest: no entry for any reader
    assert kind == "download" and Path(first).is_file()
    assert not (rroot / kind / key / "manifest.json").exists()
    assert Remote(url).peek(kind, key, remote_key) is None
    assert remote_manifests(url) == {}
    b = cluster.add_worker("B", _worker_env(client, "B", url, tmp_path))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + a.log() + b.log()
    assert a.started() == [f"[download:r8] building download {key[:12]}"] and a.built() == []
    assert f"{kind}/{key}" in b.built() and len(b.built()) == 6
    remote = remote_manifests(url)
    assert len(remote) == 6
    m = json.loads(remote[f"{kind}/{key}"])
    assert m["builder"]["name"] == "B" and m["remote"]["data"] != data
    # A's data folder is still there, referenced by no manifest; every manifest's files are complete
    fs, root = remote_fs(url)
    assert fs.exists(f"{root}/{kind}/{key}/{data}")
    for k, raw in remote.items():
        mm = json.loads(raw)
        for rel, meta in mm["outputs"].items():
            assert fs.size(f"{root}/{k}/{mm['remote']['data']}/{rel}") == meta["size"]
    assert Remote(url).peek(kind, key, remote_key)["remote"]["data"] == m["remote"]["data"]
    assert client.doit("run", "build:r8").ran() == []


QWEN7B = dict(
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    max_position_embeddings=32768,
    model_type="qwen2",
    tie_word_embeddings=False,
)  # Qwen/Qwen2.5-7B-Instruct's config.json (benchmarks/bench_llm.py)


def test_stage_no_worker_can_hold_is_reported(tmp_path, tiny_bert, cluster):
    """qwen7b-int4's stages ask MEMORY from tasks/llm/memory.py's estimates (the source's
    config.json, here from a local Hub cache, and the recipe's export shape); on a cluster
    whose worker offers 3 GiB the build stops before submitting anything, naming each stage
    that does not fit and its bytes."""
    from tasks.llm import memory
    from tasks.llm.parts import split_for

    url = (tmp_path / "remote").as_uri()
    client = Project(tmp_path / "client", tiny_bert)
    shutil.copy(REPO / "recipes" / "qwen7b-int4.yaml", client.root / "recipes")
    for rel in (
        "tasks/llm/data/tiny-corpus.txt",
        "recipes/data/prompts-tiny.txt",
        "recipes/data/ppl-tiny.txt",
        "recipes/data/calib-chat.jsonl",
    ):
        (client.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, client.root / rel)
    rev = "a09a35458c702b33eeacc393d103063234e8bc28"
    snap = tmp_path / "hub" / "models--Qwen--Qwen2.5-7B-Instruct" / "snapshots" / rev
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(QWEN7B))
    client.env.update(NPUBUILD_REMOTE=url, HF_HUB_CACHE=str(tmp_path / "hub"))
    cluster.add_worker("S", _worker_env(client, "S", url, tmp_path), memory=3 * GiB)

    run, out = _cluster_run(client, cluster, "qwen7b-int4", check=False)
    assert run.code != 0
    est = memory.estimates(QWEN7B, split_for(QWEN7B, 4), 128, 4096, True, 4, 3)  # part 3's (issue 22)
    assert est["quantize"][0] > 8 * GiB
    assert "no worker of the cluster offers enough MEMORY for: export.part0:qwen7b-int4 " in out, out
    assert f"quantize.part3:qwen7b-int4 ({est['quantize'][0]} bytes = {est['quantize'][0] / GiB:.1f} GiB)" in out
    assert f"the largest offer is {3 * GiB} bytes (3.0 GiB) over 1 worker(s)" in out
    assert "download:qwen7b-int4 (" not in out  # the download fits (BASE)
    assert "--resources MEMORY=<bytes>" in out
    assert not (tmp_path / "remote").exists() and not cluster.workers["S"].started()


def test_cluster_needs_a_remote(project):
    project.recipe("r8")
    run = project.doit("run", "cluster", "--scheduler", "tcp://127.0.0.1:9", "r8", check=False)
    assert run.code != 0
    assert (
        "ClusterError: a cluster build needs a remote cache: set NPUBUILD_REMOTE to an fsspec URL that "
        "this machine and every worker can reach"
    ) in run.log(), run.log()
    assert not project.cache.exists()


def test_tool_and_file_differences_are_named(project, monkeypatch):
    """What a worker compares (tasks/commands/cluster/build.py ``_differences``), on the real key material of
    a stage: another onnxruntime version or another calibration file is named with both values."""
    from tasks.commands.cluster import build as cluster
    from tasks.core import keys, recipeset
    from tasks.core.session import Session

    project.recipe("r8")
    monkeypatch.setenv("NPUBUILD_ROOT", str(project.root))
    monkeypatch.setenv("NPUBUILD_CACHE", str(project.cache))
    session = Session()
    spec = recipeset.plan(session, "r8")["quantize"]
    mine = keys.key_material(session, spec, {r: type("U", (), {"output_digest": "d"})() for r in spec.inputs})
    expected = {"material": {k: mine.get(k) for k in cluster.COMPARED}, "modules": keys.code_files(session, spec)}
    assert cluster._differences(session, spec, expected, mine) == []
    expected["material"]["tools"] = dict(mine["tools"], onnxruntime="1.31.0")
    expected["material"]["files"] = {"calibration": "0" * 32}
    diffs = cluster._differences(session, spec, expected, mine)
    assert diffs[0] == f"tool versions differ: onnxruntime 1.31.0 (client) vs {mine['tools']['onnxruntime']} (worker)"
    assert diffs[1] == (
        f'files differs: {{"calibration": "{"0" * 32}"}} (client) vs '
        f'{{"calibration": "{mine["files"]["calibration"]}"}} (worker)'
    )
    assert len(diffs) == 2


def test_cluster_spreads_an_llms_parts(tmp_path, tiny_bert, cluster):
    """Issue 22: a 4-part tiny LLM through ``doit cluster`` with 2 workers (one thread each):
    the parts' exports, quantizes and compiles are independent stages, built by both workers;
    build/ is byte-identical to a local build; the stage count is the plan's."""
    from llm_projects import parts_project_at

    url = (tmp_path / "remote").as_uri()
    client = parts_project_at(tmp_path / "client", tiny_bert, "tiny4", parts=4)
    local = parts_project_at(tmp_path / "local", tiny_bert, "tiny4", parts=4)
    client.env["NPUBUILD_REMOTE"] = url
    a = cluster.add_worker("A", _worker_env(client, "A", url, tmp_path), memory=3 * GiB)
    b = cluster.add_worker("B", _worker_env(client, "B", url, tmp_path), memory=3 * GiB)
    run, out = _cluster_run(client, cluster, "tiny4")
    stages = 1 + 4 * 4 + 2  # download, 4 x (export, calibrate, quantize, compile), bundle, verify
    assert f"{stages} stages of 1 recipe(s): {stages} distinct stage(s) to build" in out, out
    built = a.built() + b.built()
    assert len(built) == len(set(built)) == stages, (a.log(), b.log())
    by = {}  # (kind, part) -> worker
    for k, m in remote_manifests(url).items():
        m = json.loads(m)
        by[(k.split("/")[0], m["params"].get("part"))] = m["builder"]["name"]
    part_stages = {w for (kind, part), w in by.items() if part is not None}
    print("built by:", {f"{kind}.part{part}": w for (kind, part), w in sorted(by.items(), key=str)})
    assert part_stages == {"A", "B"}, by  # stages of different parts on different workers
    assert {by[("export", k)] for k in range(4)} == {"A", "B"}, by  # the 4 exports need nothing but the download
    assert {kind for kind, _ in by} == {"download", "export", "calibrate", "quantize", "compile", "bundle", "verify"}
    local.doit("run", "build:tiny4")
    _same_build(build_files(client, "tiny4"), build_files(local, "tiny4"))


def test_longest_chain_first():
    """A stage's priority is the length of the longest chain behind it: with a 2-part LLM's
    shape, part 1's calibration (the chain to verify through calibrate.part1, quantize.part1,
    compile.part1) comes before part 0's quantize and compile, which the scheduler ran first
    before (benchmarks/README, the cluster's LLM timeline)."""
    from tasks.commands.cluster.build import chain_lengths

    ups = {
        "download": {},
        "export.part0": {"s": "download"},
        "export.part1": {"s": "download"},
        "calibrate.part0": {"m": "export.part0"},
        "calibrate.part1": {"m": "export.part1", "p": "calibrate.part0"},
        "quantize.part0": {"c": "calibrate.part0"},
        "quantize.part1": {"c": "calibrate.part1"},
        "compile.part0": {"m": "quantize.part0"},
        "compile.part1": {"m": "quantize.part1"},
        "bundle": {"a": "compile.part0", "b": "compile.part1"},
        "verify": {"b": "bundle", "s": "download"},
    }
    rank = chain_lengths({n: {"ups": u} for n, u in ups.items()})
    assert rank == {
        "download": 8,
        "export.part0": 7,
        "export.part1": 6,
        "calibrate.part0": 6,
        "calibrate.part1": 5,
        "quantize.part0": 4,
        "quantize.part1": 4,
        "compile.part0": 3,
        "compile.part1": 3,
        "bundle": 2,
        "verify": 1,
    }
