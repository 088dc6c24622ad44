"""End to end: a HF decoder -> Genie-layout graphs (tasks/llm/genie/graphs.py) -> one QNN context binary
per graph (fp32 IO, x86_64 HTP prepare) -> genie_config.json + htp_backend_ext_config.json +
tokenizer.json -> GenieDialog_tokenQuery through libGenie.so on the HTP simulator, compared with
transformers' fp32 greedy tokens and the same graphs on onnxruntime's CPU EP.

    .venv/bin/python scripts/genie_run.py OUT_DIR [--model DIR] [--seq 16] [--ctx 64] [--parts 1]
        [--new 16] [--log-level N] [--no-sanitize] [--prompt TEXT ...]

Without --model it uses the tiny trained Qwen2 fixture (tests/llm_fixtures.py). Prints one JSON
line per prompt and a summary; writes OUT_DIR/report.json. The Genie run is in a child process
(a crash in the QNN libraries stays there); its working folder is OUT_DIR/bundle.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_PROMPTS = [
    "The old lighthouse",
    "To plant a tree,",
    "Every morning the farmer",
    "A purple dog walked into the bakery and",
    "The teacher wrote a question on the board. Every morning the farmer",
]


def build(model_dir: Path, out: Path, seq: int, ctx: int, parts: int, sanitize: bool) -> dict:
    """Export to ``out/export``, compile each graph into ``out/bundle`` (``*_ctx.onnx`` kept in
    ``out/export``), write the two config files; returns the export description + ``ctx_bins``."""
    from tasks.llm.genie.graphs import export_genie
    from tasks.llm.genie.binaries import rename_graph
    from tasks.llm.genie.config import SIMULATOR_SETTINGS, genie_config, htp_backend_ext_config, with_settings
    from tasks.qnn.ep import compile_in_subprocess
    from tasks.qnn.targets import DEFAULT_TARGET

    exp, bundle = out / "export", out / "bundle"
    shutil.rmtree(exp, ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    bundle.mkdir(parents=True)
    t = time.perf_counter()
    desc = export_genie(model_dir, exp, seq_len=seq, context_len=ctx, parts=parts, sanitize_past=sanitize)
    desc["export_seconds"] = time.perf_counter() - t
    bins, t = [], time.perf_counter()
    for kind in ("prompt", "token"):  # Genie groups graphs by (AR, CL); order in ctx-bins: part order
        for p in desc["parts"]:
            src = exp / p[kind]["path"]
            ctx_path = src.with_name(f"{src.stem}_ctx.onnx")
            ctx_path.unlink(missing_ok=True)
            compile_in_subprocess(src, ctx_path, DEFAULT_TARGET)
            b = ctx_path.with_name(f"{src.stem}_ctx_qnn.bin")
            name = f"{p[kind]['graph']}.bin"
            shutil.copyfile(b, bundle / name)
            rename_graph(bundle / name, p[kind]["graph"])  # Genie orders splits by the name
            bins.append(name)
    desc["compile_seconds"] = time.perf_counter() - t
    desc["ctx_bins"] = bins
    shutil.copyfile(exp / "tokenizer.json", bundle / "tokenizer.json")
    (bundle / "htp_backend_ext_config.json").write_text(json.dumps(htp_backend_ext_config(DEFAULT_TARGET), indent=1))
    cfg = with_settings(genie_config(desc, bins), SIMULATOR_SETTINGS)  # runs on the simulator, as verify's copy
    (bundle / "genie_config.json").write_text(json.dumps(cfg, indent=1))
    return desc


def genie_child(spec: str) -> None:
    """Child process: run GenieDialog_tokenQuery for each prompt; prints one JSON line each."""
    from tasks.qnn.libgenie import GenieDialog

    s = json.loads(spec)
    lines: list[str] = []
    cfg = Path("genie_config.json").read_text()
    if s.get("debug"):
        c = json.loads(cfg)
        c["dialog"]["debug"] = s["debug"]
        cfg = json.dumps(c)
    try:
        with GenieDialog(cfg, log_level=s["log_level"], log=lines.append) as d:
            print(json.dumps({"create_seconds": d.create_seconds}), flush=True)
            for ids in s["prompts"]:
                toks, status, secs = d.generate(ids, s["new"])
                print(json.dumps({"tokens": toks, "status": status, "seconds": secs}), flush=True)
    finally:
        if s.get("log_file"):
            Path(s["log_file"]).write_text("\n".join(lines) + "\n")


def run_genie(bundle: Path, prompts_ids, new: int, log_level, log_file=None, debug=None, timeout=1800):
    """Run :func:`genie_child` in ``bundle``; returns (create_seconds, [{"tokens", "status",
    "seconds"}], returncode, stderr tail)."""
    spec = json.dumps(
        {
            "prompts": prompts_ids,
            "new": new,
            "log_level": log_level,
            "log_file": str(log_file) if log_file else None,
            "debug": debug,
        }
    )
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'scripts')!r}); "
        f"import genie_run; genie_run.genie_child(sys.argv[1])"
    )
    r = subprocess.run([sys.executable, "-c", code, spec], cwd=bundle, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    create = rows[0]["create_seconds"] if rows and "create_seconds" in rows[0] else None
    return create, [x for x in rows if "tokens" in x], r.returncode, r.stderr[-2000:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", type=Path)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--log-level", type=int, default=None)
    ap.add_argument("--no-sanitize", action="store_true")
    ap.add_argument("--skip-build", action="store_true")
    ap.add_argument("--prompt", action="append")
    ap.add_argument("--dump", help="Genie debug folder: dump-tensors + dump-specs there (relative to OUT/bundle)")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from llm_fixtures import hf_reference, tiny_model
    from transformers import AutoTokenizer

    import onnxruntime as ort
    from tasks.llm.genie.host_loop import GenieHostLoop

    model = a.model or tiny_model("qwen2")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.skip_build:
        desc = json.loads((a.out / "export" / "genie_export.json").read_text())
        desc["ctx_bins"] = json.loads((a.out / "bundle" / "genie_config.json").read_text())["dialog"]["engine"][
            "model"
        ]["binary"]["ctx-bins"]
    else:
        desc = build(model, a.out, a.seq, a.ctx, a.parts, not a.no_sanitize)
    tok = AutoTokenizer.from_pretrained(str(model))
    prompts = a.prompt or DEFAULT_PROMPTS
    ids = [tok(p)["input_ids"] for p in prompts]
    hf = [t for t, _ in hf_reference(model, ids, a.new)]
    cpu = GenieHostLoop(a.out / "export", lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]))
    host = [cpu.generate(i, a.new) for i in ids]
    poisoned = GenieHostLoop(
        a.out / "export", lambda p: ort.InferenceSession(p, providers=["CPUExecutionProvider"]), fill=7e34
    ).generate(ids[0], a.new)
    create, rows, rc, err = run_genie(
        a.out / "bundle",
        ids,
        a.new,
        a.log_level,
        a.out / "genie.log",
        {"path": a.dump, "dump-tensors": True, "dump-specs": True} if a.dump else None,
    )
    per = []
    for p, i, h, c, g in zip(prompts, ids, hf, host, rows + [None] * (len(ids) - len(rows))):
        gt = g["tokens"] if g else None
        row = {
            "prompt": p,
            "prompt_ids": i,
            "hf": h,
            "onnx_cpu": c,
            "genie": gt,
            "genie_eq_hf": gt == h,
            "onnx_cpu_eq_hf": c == h,
            "genie_first_diff": next((k for k, (x, y) in enumerate(zip(gt or [], h)) if x != y), None),
            "genie_text": tok.decode(gt) if gt else None,
            "status": g and g["status"],
            "seconds": g and g["seconds"],
        }
        per.append(row)
        print(
            json.dumps(
                {
                    k: row[k]
                    for k in (
                        "prompt",
                        "genie_eq_hf",
                        "onnx_cpu_eq_hf",
                        "genie_first_diff",
                        "status",
                        "seconds",
                        "genie_text",
                    )
                }
            ),
            flush=True,
        )
    rep = {
        "model": str(model),
        "seq_len": desc["seq_len"],
        "context_len": desc["context_len"],
        "parts": len(desc["parts"]),
        "sanitize_past": desc["sanitize_past"],
        "ctx_bins": desc["ctx_bins"],
        "log_level": a.log_level,
        "genie_returncode": rc,
        "genie_create_seconds": create,
        "poisoned_cache_cpu_eq_hf": poisoned == hf[0],
        "prompts": per,
        "genie_all_eq_hf": bool(rows) and all(r["genie_eq_hf"] for r in per),
        "stderr_tail": err if rc else "",
    }
    (a.out / "report.json").write_text(json.dumps(rep, indent=1))
    print(
        json.dumps(
            {
                k: rep[k]
                for k in (
                    "genie_all_eq_hf",
                    "genie_returncode",
                    "genie_create_seconds",
                    "poisoned_cache_cpu_eq_hf",
                    "log_level",
                    "sanitize_past",
                )
            }
        )
    )
    if rc:
        print(err, file=sys.stderr)


if __name__ == "__main__":
    main()
