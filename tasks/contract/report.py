"""What a verify report says to people: where a model runs (:func:`runs_on`) and how each
runtime a bundle serves was checked (:func:`runtimes_checked`), read by the catalog row and
``doit explain``. Plain data in, one phrase out; imports nothing of the package.
"""

from __future__ import annotations


def runs_on(cpu: dict[str, int]) -> str:
    """How a model card and the catalog say where a model runs: ``npu`` when nothing is on the
    CPU (``cpu``: {op type: nodes} verify found outside the QNN HTP partitions), else
    ``npu+cpu`` with the op types left on the CPU, e.g. ``npu+cpu (Einsum x2)``."""
    if not cpu:
        return "npu"
    return "npu+cpu (" + ", ".join(f"{op} x{n}" for op, n in sorted(cpu.items())) + ")"


def runtimes_checked(report: dict) -> dict[str, str]:
    """How each runtime a bundle serves was checked, read from its ``verify.json`` (``report``):
    {runtime: one sentence}. Encoders serve onnxruntime's QNN EP (``model_ctx.onnx``); LLMs
    serve onnxruntime-genai (``genai_config.json``) and, with it in the report, Genie. What ran
    on the HTP simulator says so; what was only read back (every context binary: graphs,
    inputs/outputs, SoC; ``tasks/qnn/context_binary.py``) says that, since nothing here can load a
    weight-shared binary."""
    bins = report.get("binaries", {})
    socs = sorted({b.get("soc_model") for b in bins.values()})
    read = (
        (
            f"{len(bins)} context binar{'y' if len(bins) == 1 else 'ies'} read back (graphs, inputs/outputs, "
            f"SoC model {', '.join(map(str, socs))})"
        )
        if bins
        else "no context binary read back"
    )
    htp = report.get("backend") == "htp"
    if "runtime" not in report:  # an encoder: the EPContext model through onnxruntime's QNN EP
        ran = (
            "ran on the HTP simulator as shipped (model_ctx.onnx + its binary)"
            if htp
            else "not run: the QDQ graph ran on the CPU EP (quantization only)"
        )
        return {"onnxruntime-qnn": f"{ran}; {read}"}
    shared = sorted(b for b in bins if b.startswith("shared/"))
    twins = "the per-graph binaries (same QDQ graphs) on the HTP simulator" if htp else "the QDQ graphs on the CPU EP"
    if report.get("runtime") == "genai":
        genai = f"generated every verify prompt through onnxruntime-genai on {twins}"
    else:
        genai = f"not run through genai (verify.runtime: {report.get('runtime')}); LLMRunner generated on {twins}"
    genai += (
        f"; the shipped weight-shared binaries ({len(shared)}) read back against genai_config.json, not "
        "run (the simulator cannot load a weight-shared binary)"
        if shared
        else f"; {read}"
    )
    out = {"onnxruntime-genai": genai}
    if "genie_runner_agreement" in report.get("metrics", {}):
        out["genie"] = "generated every verify prompt through Genie (libGenie.so) on the HTP simulator"
    return out
