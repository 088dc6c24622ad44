"""Catalog, publish, bundle check and reproducibility, through the real doit CLI on the tiny BERT.

One module-scoped project holds four recipes: ``t8`` (builds and verifies), ``failing`` (the
same stages, but a max_abs_error threshold of 1e-9 no quantized model reaches: verify-failed),
``stale`` (built, then its calibration changed: stale) and ``hub`` (a Hub source at a branch,
with HF_HUB_OFFLINE=1: cannot build here, not-built). ``t8`` is published once; the tests then
rebuild it from empty caches and compare, check and break copies of the bundle, and push it to
a local HTTP stand-in of the Hugging Face Hub.

What the Hub stand-in does not cover: authentication and permissions, the Xet upload protocol
(the stand-in answers the LFS batch call with ``transfer: basic``, as for a repo without Xet;
the real Hub picks Xet for new repos when hf_xet is installed), multipart LFS uploads (files
above the server's chunk size), create_repo's 409 "already exists" answer, rate limits and
retries, and whether the real Hub renders the model card's metadata as expected.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import tempfile
import tarfile
import threading
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import TINY_RECIPE, Project

from tasks.commands.publish.check import check_bundle
from tasks.commands.publish.reproduce import differing_ranges

HUB_RECIPE = """\
license: mit
source: {hf: npubuild-test/not-in-any-cache, revision: main}
quantize:
  calibration: {file: data/calib.txt, samples: 4, max_length: 16}
verify:
  data: {file: data/verify.txt, samples: 3, max_length: 16}
"""


def _tiny(**changes) -> str:
    text = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq")
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    return text


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def tree_sums(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def proj(tmp_path_factory, tiny_bert) -> Project:
    p = Project(tmp_path_factory.mktemp("catalog") / "proj", tiny_bert)
    p.recipe("t8")
    p.recipe("failing", _tiny(**{"pooled_cosine_mean: 0.9": "max_abs_error: 1.0e-9"}))
    p.recipe("stale")
    p.recipe("hub", HUB_RECIPE)
    p.doit("run", "build:t8")
    bad = p.doit("run", "build:failing", check=False)  # shares every entry with t8; only verify judges
    assert bad.code != 0 and "max_abs_error" in bad.log()
    p.doit("run", "build:stale")
    p.recipe("stale", _tiny(**{"samples: 4": "samples: 5"}))  # quantize key changes; not rebuilt
    p.doit("run", "publish:t8")
    return p


def _bundle(proj: Project) -> Path:
    return proj.root / "dist" / "t8"


def _archive(proj: Project) -> Path:
    (a,) = (proj.root / "dist").glob("t8-*.tar.gz")
    return a


# ------------------------------------------------------------ publish + determinism


def test_publish_makes_bundle_manifest_card_and_archive(proj):
    b = _bundle(proj)
    files = set(tree_sums(b))
    assert {
        "model_ctx.onnx",
        "model_ctx_qnn.bin",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
        "config.json",
        "special_tokens_map.json",
        "verify.json",
        "README.md",
        "manifest.json",
    } == files
    m = json.loads((b / "manifest.json").read_text())
    assert set(m["files"]) == files - {"manifest.json"}
    for rel, meta in m["files"].items():
        assert meta == {"sha256": sha256(b / rel), "size": (b / rel).stat().st_size}
    st = json.loads((proj.root / "build" / "t8" / "stages.json").read_text())
    assert {s: v["key"] for s, v in m["stages"].items()} == {s: v["key"] for s, v in st.items()}
    assert m["resolved_recipe"]["name"] == "t8" and m["resolved_recipe"]["quantize"]["precision"] == "w8a16"
    assert {"qnn-sdk", "onnxruntime", "onnxruntime-qnn", "optimum", "transformers"} <= set(m["tools"])
    assert m["source"]["kind"] == "path" and m["build_platform"]["machine"]
    from tasks.store.digest import digest_json

    assert m["build_key"] == digest_json({s: v["key"] for s, v in st.items()})[:12]  # every stage's key
    assert _archive(proj).name == f"t8-{m['build_key']}.tar.gz"
    text = json.dumps(m)
    assert str(proj.root) not in text and "finished" not in text and "build_seconds" not in text
    card = (b / "README.md").read_text()
    assert card.startswith("---\n") and "license: apache-2.0" in card and "pooled_cosine_mean" in card
    from huggingface_hub import ModelCard

    assert ModelCard.load(b / "README.md").data.license == "apache-2.0"
    with tarfile.open(_archive(proj)) as tar:
        members = tar.getmembers()
    names = [t.name for t in members]
    assert names == sorted(names) and names[0] == "t8"
    assert {n.removeprefix("t8/") for n in names if members[names.index(n)].isfile()} == files
    assert all(t.mtime == 0 and t.uid == 0 and t.gid == 0 and t.uname == "" and t.gname == "" for t in members)
    assert all(t.mode == (0o755 if t.isdir() else 0o644) for t in members)
    raw = _archive(proj).read_bytes()
    assert raw[:2] == b"\x1f\x8b" and raw[4:8] == b"\0\0\0\0"  # gzip magic, header mtime 0


def test_one_artifact_listing_for_build_folder_bundle_and_catalog(proj, monkeypatch):
    """build/<recipe>/, the published bundle and the catalog's artifact sizes all come from
    tasks.core.state.artifacts over one typed build state (issue 11)."""
    for k, v in proj.env.items():
        if k.startswith("NPUBUILD_"):
            monkeypatch.setenv(k, v)
    from tasks.core import status
    from tasks.core.row import artifact_sizes
    from tasks.core.session import Session
    from tasks.core.record import read_state
    from tasks.core.state import artifacts, build_state

    session = Session()
    state = build_state(status.ReadOnlyResolver(session, "t8"), read_state(session, "t8"))
    assert [s.status for s in state.stages.values()] == ["local hit"] * 6 and state.complete
    arts = artifacts(state)
    built = {
        k: v for k, v in tree_sums(proj.root / "build" / "t8").items() if k not in ("artifacts.json", "stages.json")
    }
    shipped = {k: v for k, v in tree_sums(_bundle(proj)).items() if k not in ("README.md", "manifest.json")}
    assert built == shipped == {rel: sha256(a.path) for rel, a in arts.items()}
    assert artifact_sizes(status.recipe_status("t8")) == {
        "x-elite": {a.rel: a.path.stat().st_size for a in arts.values() if a.kind == "compile"}
    }
    stale = build_state(status.ReadOnlyResolver(session, "stale"), read_state(session, "stale"))
    assert [stale.stages[s].status for s in ("prepatch", "quantize", "compile", "verify")] == [
        "local hit",
        "stale",
        "blocked",
        "blocked",
    ]
    assert "quantize" in stale.stages["compile"].problem


COMPILE_OUTPUTS = {"model_ctx.onnx", "model_ctx_qnn.bin"}


def test_publish_is_deterministic(proj, tmp_path):
    """Publishing the same cache entries twice (another dist folder, another time) gives
    byte-identical bundles and archives: nothing in publish depends on time, place or order."""
    other = Project.__new__(Project)
    other.root, other.env = proj.root, dict(proj.env, NPUBUILD_DIST=str(tmp_path / "dist"))
    other.doit("run", "publish:t8")
    assert tree_sums(tmp_path / "dist" / "t8") == tree_sums(_bundle(proj))
    (a,) = (tmp_path / "dist").glob("t8-*.tar.gz")
    assert a.name == _archive(proj).name and sha256(a) == sha256(_archive(proj))


def test_three_builds_from_empty_caches_are_byte_identical(proj, tmp_path):
    """Two more builds of t8 from empty caches, each in its own folder (other names, other
    depths, another doit database) and its own processes, give bundles and archives that are
    byte-identical to the first by sha256, every file included: no excused file or region
    (issue 12; the context binary's racy padding variant is compiled again: tasks/qnn/ep.py compile_settled)."""
    bundles, archives = [tree_sums(_bundle(proj))], [_archive(proj)]
    for folder in (tmp_path / "b", tmp_path / "a much longer folder name" / "deeper" / "c"):
        env = dict(
            proj.env,
            NPUBUILD_CACHE=str(folder / "cache"),
            NPUBUILD_BUILD=str(folder / "build"),
            NPUBUILD_HOME=str(folder / "home"),
            NPUBUILD_DIST=str(folder / "dist"),
        )
        other = Project.__new__(Project)
        other.root, other.env = proj.root, env
        run = other.doit("run", "build:t8", "publish:t8")
        assert "export:t8" in run.ran() and "compile:t8" in run.ran()  # really rebuilt from nothing
        bundles.append(tree_sums(folder / "dist" / "t8"))
        (arch,) = (folder / "dist").glob("t8-*.tar.gz")
        archives.append(arch)
        assert (proj.root / "build" / "t8" / "verify.json").read_bytes() == (
            folder / "build" / "t8" / "verify.json"
        ).read_bytes()
    assert COMPILE_OUTPUTS | {"manifest.json", "README.md"} <= set(bundles[0])
    for other_bundle in bundles[1:]:
        differ = sorted(k for k in set(bundles[0]) | set(other_bundle) if bundles[0].get(k) != other_bundle.get(k))
        assert differ == [], differ
    assert len({a.name for a in archives}) == 1 and len({sha256(a) for a in archives}) == 1


def test_reproduce_task_reports_every_file(proj):
    run = proj.doit("run", "reproduce:t8", check=False)
    out = run.tasks["reproduce:t8"]["out"]
    m = json.loads((_bundle(proj) / "manifest.json").read_text())
    lines = out.splitlines()
    for rel in [*m["files"], "manifest.json", _archive(proj).name]:
        line = next((x for x in lines if x.startswith(("identical", "DIFFERS")) and f" {rel} " in x + " "), None)
        assert line, (rel, out)
        assert line.startswith("identical"), line  # every file, the context binary included
    assert "verify metrics identical" in out and f"byte-identical: {len(m['files']) + 1} files and the archive" in out
    assert run.code == 0 and "DIFFERS" not in out and "known" not in out
    # progress while it rebuilds: each stage's line as it ends, after the minutes so far
    progress = re.findall(r"^\[reproduce:t8\] +\d+\.\d min  (\S+:t8) ", out, re.M)
    assert progress[:6] == [f"{s}:t8" for s in ("download", "export", "prepatch", "quantize", "compile", "verify")], out


def test_reproduce_refuses_a_recipe_changed_since_publishing(proj):
    """The recipe's calibration samples changed after publishing: reproduce says so in one
    line naming the change, before rebuilding anything (a tester saw 20 DIFFERS lines for a
    bundle that was simply another build's)."""
    path = proj.root / "recipes" / "t8.yaml"
    text = path.read_text()
    try:
        path.write_text(text.replace("samples: 4", "samples: 5", 1))
        run = proj.doit("run", "reproduce:t8", check=False)
    finally:
        path.write_text(text)
    log = run.log()
    assert run.code != 0 and "DIFFERS" not in log and "Traceback" not in log, log
    build_key = json.loads((_bundle(proj) / "manifest.json").read_text())["build_key"]
    assert (
        f"manifest.json: published (build {build_key}) from another recipe than t8 resolves to now: "
        f"quantize.calibration.samples: 4 -> 5; a rebuild would not be that bundle"
    ) in log, log
    assert "[reproduce:t8] doit build:t8" not in log  # refused before any rebuild


def test_archive_mtime_from_source_date_epoch(proj, tmp_path):
    env = dict(proj.env, SOURCE_DATE_EPOCH="1700000000", NPUBUILD_DIST=str(tmp_path / "dist"))
    other = Project.__new__(Project)
    other.root, other.env = proj.root, env
    other.doit("run", "publish:t8")
    (a,) = (tmp_path / "dist").glob("t8-*.tar.gz")
    with tarfile.open(a) as tar:
        assert {t.mtime for t in tar.getmembers()} == {1700000000}
    m = json.loads((tmp_path / "dist" / "t8" / "manifest.json").read_text())
    assert m["archive_mtime"] == {"seconds": 1700000000, "from": "SOURCE_DATE_EPOCH"}


# ------------------------------------------------------------ refusing


def test_publish_refuses_failed_verify(proj):
    run = proj.doit("run", "publish:failing", check=False)
    assert run.code != 0
    assert "refusing to publish failing: its verify failed" in run.log()
    assert "max_abs_error" in run.log() and "threshold <= 1e-09" in run.log()
    assert not (proj.root / "dist" / "failing").exists()


def test_publish_refuses_stale_build(proj):
    run = proj.doit("run", "publish:stale", check=False)
    assert run.code != 0
    assert "refusing to publish stale: its build is stale" in run.log() and "doit build:stale" in run.log()
    assert not (proj.root / "dist" / "stale").exists()
    run = proj.doit("run", "publish:hub", check=False)
    assert run.code != 0 and "refusing to publish hub: it is not built" in run.log()


def test_a_republished_recipe_leaves_one_archive_in_dist(project):
    """A recipe published, rebuilt with another key and published again: dist/ holds the new
    archive only (the earlier one, which no longer matches dist/<recipe>/, was a stale choice
    a new user picked); another recipe whose name starts the same keeps its archive."""
    project.recipe("t8")
    project.recipe("t8-x")
    project.doit("run", "build:t8", "build:t8-x")
    project.doit("run", "publish:t8")
    project.doit("run", "publish:t8-x")
    dist = project.root / "dist"
    (first,) = dist.glob("t8-????????????.tar.gz")
    (other,) = dist.glob("t8-x-*.tar.gz")
    project.recipe("t8", _tiny(**{"samples: 4": "samples: 5"}))  # quantize key changes: a new short key
    project.doit("run", "build:t8")
    run = project.doit("run", "publish:t8")
    (second,) = dist.glob("t8-????????????.tar.gz")
    assert second != first and not first.exists() and other.exists()
    assert f"removed {first.name}: an earlier build's archive" in run.log(), run.log()
    m = json.loads((dist / "t8" / "manifest.json").read_text())
    assert second.name == f"t8-{m['build_key']}.tar.gz"


# ------------------------------------------------------------ catalog


def test_catalog_lists_every_recipe_with_its_state(proj):
    proj.doit("run", "catalog")
    path = proj.root / "catalog" / "catalog.json"
    first = path.read_bytes()
    cat = json.loads(first)
    assert cat["schema_version"] == 1
    rows = {r["name"]: r for r in cat["recipes"]}
    assert [r["name"] for r in cat["recipes"]] == ["failing", "hub", "stale", "t8"]
    assert {n: r["state"] for n, r in rows.items()} == {
        "t8": "verified",
        "failing": "verify-failed",
        "stale": "stale",
        "hub": "not-built",
    }
    t8 = rows["t8"]
    assert t8["architecture"] == {"model_type": "bert", "architectures": ["BertModel"]}
    assert 900_000 < t8["parameters"] < 1_100_000  # 30522x32 word embeddings + 2 tiny layers
    assert t8["precision"] == "w8a16" and t8["targets"] == ["x-elite"] and t8["sequence_length"] == 16
    assert t8["context_length"] is None and t8["parts"] is None
    built = proj.root / "build" / "t8"
    assert t8["artifacts"]["x-elite"] == {
        f: (built / f).stat().st_size for f in ("model_ctx.onnx", "model_ctx_qnn.bin")
    }
    assert t8["verify"]["x-elite"]["metrics"]["pooled_cosine_mean"] > 0.9 and t8["verify"]["x-elite"]["failures"] == []
    assert set(t8["tools"]) == {"qnn-sdk", "onnxruntime", "onnxruntime-qnn", "optimum", "transformers"}
    assert "unknown" not in t8["tools"].values()
    assert all(t8["stage_keys"].values())
    assert rows["failing"]["failures"] and "1e-09" in rows["failing"]["failures"][0]
    assert rows["failing"]["stage_keys"] == t8["stage_keys"]  # thresholds are not in the key
    assert rows["stale"]["reason"] and rows["stale"]["verify"] is None
    hub = rows["hub"]
    assert "offline" in hub["reason"] and hub["source"]["repo"] == "npubuild-test/not-in-any-cache"
    assert set(hub["stage_keys"].values()) == {None}
    md = (proj.root / "catalog" / "README.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| Recipe")]
    assert [line.split("|")[1].strip() for line in table] == ["failing", "hub", "stale", "t8"]
    proj.doit("run", "catalog")
    assert path.read_bytes() == first  # stable: same inputs, same bytes


class _TableParser(HTMLParser):
    """The header and rows of ``table#catalog``; ``net``: what the page would load (``src``
    attributes, ``<link>`` elements); ``links``: the ``href`` of its anchors."""

    def __init__(self):
        super().__init__()
        self.heads, self.rows, self.net, self.links, self.scripts = [], [], [], [], 0
        self._where, self._cell, self._row, self._table = None, None, None, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("src"):
            self.net.append((tag, a["src"]))
        if tag == "link":
            self.net.append((tag, a))
        if a.get("href"):
            (self.links if tag == "a" else self.net).append(a["href"])
        if tag == "script":
            self.scripts += 1
        if tag == "table":
            self._table = a.get("id")
        if self._table != "catalog":
            return
        if tag in ("thead", "tbody"):
            self._where = tag
        elif tag == "tr" and self._where == "tbody" and a.get("class") != "details":  # a row's facts: not a row
            self._row = []
        elif tag in ("td", "th") and (self._row is not None or self._where == "thead"):
            self._cell = [a.get("data-sort"), ""]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = None
        if tag in ("td", "th") and self._cell is not None:
            (self.heads if self._where == "thead" else self._row).append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None


def test_catalog_html_parses_to_one_row_per_recipe(proj):
    proj.doit("run", "catalog")
    page = (proj.root / "catalog" / "index.html").read_text()
    p = _TableParser()
    p.feed(page)
    p.close()
    heads = [h[1] for h in p.heads]
    assert heads == ["Recipe", "Task", "Licence", "Size", "Precision", "Context", "Memory", "Decode", "State", "Links"]
    assert [r[0][1] for r in p.rows] == ["failing", "hub", "stale", "t8"]
    assert {r[0][1]: r[heads.index("State")][1] for r in p.rows} == {
        "t8": "verified",
        "failing": "verify-failed",
        "stale": "stale",
        "hub": "not-built",
    }
    assert all(len(r) == len(heads) and all(c[0] is not None for c in r) for r in p.rows)  # sortable cells
    assert "<dt>QNN SDK</dt>" in page  # the other facts, in each row's details
    params = heads.index("Size")
    t8 = next(r for r in p.rows if r[0][1] == "t8")
    assert int(t8[params][0]) > 900_000
    # nothing loaded (scripts and styles inline); links only to the source's Hub card or PyPI page,
    # once published the bundle under dist/ (t8: published by the fixture), and the pages of the
    # figures measured by others (tasks/commands/catalog/published.json)
    assert p.net == [] and p.scripts >= 1 and "http://" not in page, (p.net, p.scripts)
    assert all(
        u.startswith(
            (
                "https://huggingface.co/",
                "https://pypi.org/project/",
                "../dist/",
                "https://github.com/quic/ai-hub-models/",
            )
        )
        for u in p.links
    ), p.links
    assert {"../dist/t8/README.md", "../dist/t8/"} <= set(p.links), p.links


def test_catalog_page_screenshot(proj, tmp_path):
    """Renders the page in headless Chromium (Debian's package; .ci/run installs it): the
    screenshot of the catalog holds far more than that of an empty page of the same size."""
    chromium = Path("/usr/bin/chromium")
    assert chromium.exists(), "no /usr/bin/chromium: apt-get install chromium (.ci/run does)"
    import subprocess

    proj.doit("run", "catalog")
    (tmp_path / "blank.html").write_text("<!doctype html><title>blank</title>")

    def shot(page: Path) -> Path:
        out = tmp_path / f"{page.stem}.png"
        subprocess.run(
            [
                str(chromium),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}",
                f"--screenshot={out}",
                "--window-size=1600,600",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        return out

    page, blank = shot(proj.root / "catalog" / "index.html"), shot(tmp_path / "blank.html")
    assert page.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.stat().st_size > 5 * blank.stat().st_size, (page.stat().st_size, blank.stat().st_size)
    shutil.copyfile(page, Path(tempfile.gettempdir()) / "npubuild-catalog.png")  # for a human look


# ------------------------------------------------------------ bundle check


@pytest.fixture
def bundle_copy(proj, tmp_path) -> Path:
    dest = tmp_path / "t8"
    shutil.copytree(_bundle(proj), dest)
    assert check_bundle(dest) == {"mismatch": [], "missing": [], "extra": []}
    return dest


def test_bundle_check_catches_a_flipped_byte(proj, bundle_copy):
    f = bundle_copy / "model_ctx_qnn.bin"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert check_bundle(bundle_copy) == {"mismatch": ["model_ctx_qnn.bin: sha256 differs"], "missing": [], "extra": []}
    run = proj.doit("run", "check_bundle", "--path", str(bundle_copy), check=False)
    assert run.code != 0 and "MISMATCH model_ctx_qnn.bin: sha256 differs" in run.log()


def test_bundle_check_catches_a_missing_file(proj, bundle_copy):
    (bundle_copy / "vocab.txt").unlink()
    assert check_bundle(bundle_copy) == {"mismatch": [], "missing": ["vocab.txt"], "extra": []}
    run = proj.doit("run", "check_bundle", "--path", str(bundle_copy), check=False)
    assert run.code != 0 and "MISSING vocab.txt" in run.log()


def test_bundle_check_catches_an_extra_file(proj, bundle_copy):
    (bundle_copy / "sub").mkdir()
    (bundle_copy / "sub" / "notes.txt").write_text("not published")
    assert check_bundle(bundle_copy) == {"mismatch": [], "missing": [], "extra": ["sub/notes.txt"]}
    run = proj.doit("run", "check_bundle", "--path", str(bundle_copy), check=False)
    assert run.code != 0 and "EXTRA sub/notes.txt" in run.log()
    assert proj.doit("run", "check_bundle", "--path", str(_bundle(proj))).code == 0


# ------------------------------------------------------------ targets: folder, Hub


def test_publish_to_a_folder_and_dry_run(proj, tmp_path):
    before = tree_sums(proj.root / "dist")
    dry = proj.doit("run", "publish:t8", "--dry-run", "--dest", str(tmp_path / "dry"), "--hub-repo", "me/tiny")
    out = dry.tasks["publish:t8"]["out"]
    assert "would call HfApi.create_repo(repo_id='me/tiny', repo_type='model', exist_ok=True)" in out
    assert "would call HfApi.upload_folder(repo_id='me/tiny'" in out
    assert "would call HfApi.create_tag(repo_id='me/tiny'" in out and "tag='npubuild-" in out
    assert "would copy t8/" in out and "[dry-run]   model_ctx_qnn.bin" in out
    # a package source has no commit time: the archive's mtime is 0, said as such (was "unknown (0)")
    assert "(every entry's mtime 0: the source has no commit time; SOURCE_DATE_EPOCH sets one)" in out, out
    assert not (tmp_path / "dry").exists() and tree_sums(proj.root / "dist") == before
    proj.doit("run", "publish:t8", "--dest", str(tmp_path / "shelf"))
    assert tree_sums(tmp_path / "shelf" / "t8") == tree_sums(_bundle(proj))
    assert sha256(tmp_path / "shelf" / _archive(proj).name) == sha256(_archive(proj))


class _HubStandIn(BaseHTTPRequestHandler):
    """Just enough of the Hub API for create_repo, upload_folder (preupload, LFS basic
    upload, NDJSON commit) and create_tag. State lives on the server object."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                n = int(self.rfile.readline().strip().split(b";")[0], 16)
                if n == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(n)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self):
        s, body = self.server, self._body()
        s.calls.append(("PUT", self.path, self.headers.get("Authorization")))
        if self.path.startswith("/lfs-upload/"):
            oid = self.path.rsplit("/", 1)[1]
            assert hashlib.sha256(body).hexdigest() == oid
            s.lfs[oid] = body
            return self._send({})
        self._send({"error": "unknown"}, 404)

    def do_POST(self):
        s, body, path = self.server, self._body(), self.path.split("?")[0]
        s.calls.append(("POST", path, self.headers.get("Authorization")))
        base = f"http://127.0.0.1:{s.server_port}"
        if path == "/api/repos/create":
            req = json.loads(body)
            repo = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
            s.repos.setdefault(repo, {"files": {}, "commits": [], "tags": {}})
            return self._send({"url": f"{base}/{repo}", "name": repo})
        if path == "/api/validate-yaml":  # create_commit checks a README.md's metadata
            s.validated.append(json.loads(body))
            return self._send({"errors": [], "warnings": []})
        if path.startswith("/api/models/") and "/preupload/" in path:
            files = json.loads(body)["files"]
            return self._send(
                {
                    "files": [
                        {
                            "path": f["path"],
                            "uploadMode": "lfs" if f["path"].endswith(".bin") else "regular",
                            "shouldIgnore": False,
                        }
                        for f in files
                    ]
                }
            )
        if path.endswith(".git/info/lfs/objects/batch"):
            req = json.loads(body)
            s.lfs_transfers.append(req["transfers"])
            return self._send(
                {
                    "transfer": "basic",
                    "objects": [
                        {
                            "oid": o["oid"],
                            "size": o["size"],
                            "actions": {"upload": {"href": f"{base}/lfs-upload/{o['oid']}"}},
                        }
                        for o in req["objects"]
                    ],
                }
            )
        if path.startswith("/api/models/") and "/commit/" in path:
            repo = path[len("/api/models/") :].split("/commit/")[0]
            header, files = None, {}
            for line in body.splitlines():
                item = json.loads(line)
                v = item["value"]
                if item["key"] == "header":
                    header = v
                elif item["key"] == "file":
                    files[v["path"]] = base64.b64decode(v["content"])
                elif item["key"] == "lfsFile":
                    files[v["path"]] = s.lfs[v["oid"]]
            oid = hashlib.sha1(
                json.dumps(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
            ).hexdigest()
            s.repos[repo]["files"].update(files)
            s.repos[repo]["commits"].append({"oid": oid, "message": header["summary"]})
            return self._send({"commitUrl": f"{base}/{repo}/commit/{oid}", "commitOid": oid})
        if path.startswith("/api/models/") and "/tag/" in path:
            repo, rev = path[len("/api/models/") :].split("/tag/")
            s.repos[repo]["tags"][json.loads(body)["tag"]] = rev
            return self._send({})
        self._send({"error": f"stand-in does not implement POST {path}"}, 404)


@pytest.fixture
def hub_standin():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _HubStandIn)
    srv.calls, srv.repos, srv.lfs, srv.lfs_transfers, srv.validated = [], {}, {}, [], []
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_publish_to_hub_standin(proj, hub_standin, tmp_path):
    env = dict(
        proj.env,
        HF_ENDPOINT=f"http://127.0.0.1:{hub_standin.server_port}",
        HF_HUB_OFFLINE="0",
        HF_TOKEN="hf_standintoken0123456789",
        HF_HOME=str(tmp_path / "hf-home"),
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        HF_HUB_DISABLE_TELEMETRY="1",
    )
    other = Project.__new__(Project)
    other.root, other.env = proj.root, env
    run = other.doit("run", "publish:t8", "--hub-repo", "npubuild-test/tiny-t8")
    out = run.tasks["publish:t8"]["out"]
    repo = hub_standin.repos["npubuild-test/tiny-t8"]
    bundle = tree_sums(_bundle(proj))
    assert {k: hashlib.sha256(v).hexdigest() for k, v in repo["files"].items()} == bundle
    m = json.loads((_bundle(proj) / "manifest.json").read_text())
    (commit,) = repo["commits"]
    assert repo["tags"] == {f"npubuild-{m['build_key']}": commit["oid"]}
    assert commit["message"] == f"npubuild t8 build {m['build_key']}"
    assert hashlib.sha256(repo["files"]["model_ctx_qnn.bin"]).hexdigest() in hub_standin.lfs  # went via LFS
    assert hub_standin.validated and "license: apache-2.0" in hub_standin.validated[0]["content"]
    api_calls = [c for c in hub_standin.calls if c[0] == "POST"]  # the LFS PUT goes to a pre-signed URL
    assert api_calls and all(auth == "Bearer hf_standintoken0123456789" for _, _, auth in api_calls)
    assert f"tagged npubuild-{m['build_key']}" in out and "hf_standintoken" not in run.log()
    # a second publish of the same build: create_repo(exist_ok) and the tag again, no error
    other.doit("run", "publish:t8", "--hub-repo", "npubuild-test/tiny-t8")
    assert len(repo["commits"]) == 2


# ------------------------------------------------------------ the context binary's racy padding run


def test_racy_marks_are_the_starts_of_long_0xff_runs_two_bytes_into_a_block(tmp_path):
    """qnn.racy_marks (a scan with bytes.find) against its definition as a regex: every run of
    >= 256 0xff bytes (leftmost, greedy, not overlapping) whose start % 128 == 2; on random
    buffers holding runs of 255..600 bytes at random offsets, at the ends too, and in an mmap."""
    import mmap
    import random
    import re

    from tasks.qnn import ep as qnn

    def by_definition(data: bytes) -> tuple:
        return tuple(m.start() for m in re.finditer(rb"\xff{256,}", data) if m.start() % 128 == 2)

    rng = random.Random(12)
    seen = 0
    for _ in range(300):
        data = bytearray(rng.randbytes(rng.randrange(0, 6000)))
        for _ in range(rng.randrange(0, 6)):
            at, n = rng.randrange(0, len(data) + 1), rng.choice([255, 256, 257, 300, 600])
            at = at - at % 128 + rng.choice([0, 1, 2, 3, 126]) if rng.random() < 0.7 else at
            data[at : at + n] = b"\xff" * n
        data = bytes(data)
        assert qnn.racy_marks(data) == by_definition(data), len(data)
        seen += len(by_definition(data))
    assert seen > 50  # the cases did hold marks
    f = tmp_path / "b.bin"
    f.write_bytes(bytes(130) + b"\xff" * 300 + b"\x00" + b"\xff" * 256)
    with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert qnn.racy_marks(mm) == by_definition(f.read_bytes()) == (130,)
    assert qnn.racy_marks(b"\xff" * 300) == ()  # starts at 0
    assert qnn.racy_marks(memoryview(bytes(2) + b"\xff" * 256)) == (2,)


def _t8_qdq(proj: Project, tmp_path: Path) -> Path:
    state = json.loads((proj.root / "build" / "t8" / "stages.json").read_text())
    q = tmp_path / "q"
    q.mkdir()
    shutil.copyfile(Path(state["quantize"]["entry"]) / "out" / "model.onnx", q / "model.onnx")
    return q / "model.onnx"


def test_racy_variant_is_compiled_again_never_rewritten(proj, tmp_path):
    """The QNN SDK writes bytes 2..127 of the block before a binary's 0xff fill as 0x00 or (in
    some processes) 0xff. When a compile comes out as the 0xff variant (here: the first one,
    made so from a real compile's bytes), compile_settled compiles again and keeps the common
    variant: the bytes of a plain compile, 2 compiles; a first compile without the mark is kept
    after 1."""
    from tasks.qnn import ep as qnn

    qdq = _t8_qdq(proj, tmp_path)
    plain = tmp_path / "plain"
    plain.mkdir()  # the reference, itself settled (a plain compile is the 0xff variant now and then)
    qnn.compile_settled(
        lambda d: qnn.compile_in_subprocess(qdq, d / "model_ctx.onnx", "x-elite"), plain / "model_ctx.onnx"
    )
    common = (plain / "model_ctx_qnn.bin").read_bytes()
    assert qnn.racy_marks(common) == ()
    fill = common.index(b"\xff" * 256)
    assert fill % qnn.RACY_BLOCK == 0 and common[fill - 126 : fill] == bytes(126)
    calls = []

    def compile_into(folder: Path) -> None:  # a real compile; the first one as the SDK's 0xff variant
        qnn.compile_in_subprocess(qdq, folder / "model_ctx.onnx", "x-elite")
        calls.append(folder)
        if len(calls) == 1:
            b = folder / "model_ctx_qnn.bin"
            data = b.read_bytes()
            b.write_bytes(data[: fill - 126] + b"\xff" * 126 + data[fill:])
            assert qnn.racy_marks(b.read_bytes()) == (fill - 126,)

    out = tmp_path / "out"
    out.mkdir()
    assert qnn.compile_settled(compile_into, out / "model_ctx.onnx") >= 2  # 2, or more if the SDK raced again
    assert (out / "model_ctx_qnn.bin").read_bytes() == common and calls[1] != out
    assert sorted(p.name for p in out.iterdir()) == ["model_ctx.onnx", "model_ctx_qnn.bin"]  # scratch removed


def test_weights_that_look_like_the_racy_run_are_kept(tiny_bert, tmp_path):
    """A uint16 embedding table with 12 rows at its maximum puts >= 256 bytes of 0xff 2 bytes
    into a 128-byte block: the racy variant's mark, but weight data (found by a tester: the
    earlier rewrite to 0x00 changed outputs for those token ids). The build compiles until
    qnn.CONFIRM binaries in a row are identical, keeps them, and the binary equals a plain compile's."""
    from transformers import BertModel

    from tasks.qnn import ep as qnn

    m = BertModel.from_pretrained(tiny_bert)
    w = m.embeddings.word_embeddings.weight.data
    top = w.max().item() + 0.5
    w[2000:2012, :] = top
    w[2000, 0] = w.min().item()
    model = tmp_path / "model"
    m.save_pretrained(model)
    for f in Path(tiny_bert).iterdir():
        if f.name.startswith(("tokenizer", "vocab", "special")):
            shutil.copy(f, model)
    p = Project(tmp_path / "proj", model)
    p.recipe("r")
    p.doit("run", "compile:r")
    state_entry = next((p.cache / "compile").iterdir())
    info = json.loads((state_entry / "manifest.json").read_text())["info"]
    assert qnn.CONFIRM <= info["compiles"]["model.onnx"] <= 8, info  # CONFIRM; more when the real racy run also raced
    built = (state_entry / "out" / "model_ctx_qnn.bin").read_bytes()
    (mark,) = qnn.racy_marks(built)  # the weights' run, unchanged; the real padding run is the common 0x00
    fill = [m.start() for m in __import__("re").finditer(b"\xff{256,}", built)]
    assert mark in fill and any(f % qnn.RACY_BLOCK == 0 and built[f - 126 : f] == bytes(126) for f in fill)
    # the rewrite this replaced would have zeroed 126 bytes of embedding rows 2000-2001 here
    assert built[mark : mark + 126] == b"\xff" * 126
    qdq = next((p.cache / "quantize").iterdir()) / "out" / "model.onnx"
    d = tmp_path / "plain"
    d.mkdir()
    shutil.copyfile(qdq, d / "model.onnx")
    qnn.compile_settled(
        lambda f: qnn.compile_in_subprocess(d / "model.onnx", f / "model_ctx.onnx", "x-elite"), d / "model_ctx.onnx"
    )
    assert (d / "model_ctx_qnn.bin").read_bytes() == built


def test_differing_ranges_names_the_bytes(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    raw = bytes(range(256)) * 4096  # 1 MiB
    a.write_bytes(raw)
    changed = bytearray(raw)
    for i in (*range(1000, 1126), 1048575):
        changed[i] ^= 0xFF
    b.write_bytes(bytes(changed))
    c.write_bytes(raw[:-1])
    assert differing_ranges(a, b, chunk=4096) == [(1000, 1126), (1048575, 1048576)]
    assert differing_ranges(a, a) == []
    assert differing_ranges(a, c) == "sizes differ: 1048576 vs 1048575 bytes"
