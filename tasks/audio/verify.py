"""verify, the audio implementation: the compiled model (``backend: htp``: the EPContext model on
the HTP simulator; ``cpu-qdq``: the QDQ graph on the CPU EP) and the fp32 export stream the
held-out clips (the first ``data.samples`` lines of ``data.file`` spoken by ``data.voices``:
:func:`tasks.audio.family.clip_set`), each clip from a zero state, the state carried call to call
as the export's ``io.json`` says; then, by the task (voice activity):

- ``frame_agreement``: the share of frames (all clips) whose decision (probability > 0.5)
  equals fp32's;
- ``speech_span_iou_mean``: per clip, the IoU of the speech spans found in the compiled model's
  probabilities (:func:`tasks.audio.frames.speech_spans`, silero-vad's rule) with the known span
  of the spoken line, averaged; ``fp32_speech_span_iou_mean`` the same for fp32's;
- ``probability_max_abs_error``, ``probability_correlation``: the probabilities themselves.

Every clip's line, voice, surroundings, known span, spans found and agreement are in
``verify.json``."""

from __future__ import annotations

import math
from pathlib import Path

from tasks.audio.family import VER_NOISE, VER_SEED, VER_VOICES, clip_set, first_state, io_of, key_material
from tasks.contract import common
from tasks.contract.params import BACKEND, DATA_FILE, DATA_SAMPLES, THRESHOLDS as THRESHOLDS_PARAM
from tasks.contract.stage import Stage, Threshold
from tasks.datafiles import read_lines
from tasks.proc import lazy

np = lazy.module("numpy")

THRESHOLDS = (
    Threshold(
        "frame_agreement",
        "min",
        "agreement",
        "share of frames whose speech decision equals fp32's",
        "a share",
        0.0,
        True,
        1.0,
    ),
    Threshold(
        "speech_span_iou_mean",
        "min",
        "span_iou",
        "mean IoU of the speech found with the known span",
        "an IoU",
        0.0,
        True,
        1.0,
    ),
    Threshold(
        "probability_max_abs_error",
        "max",
        None,
        "largest |compiled - fp32| speech probability",
        "an absolute error",
        0.0,
        True,
        math.inf,
    ),
)


def score(clips: list[dict], ref: list[list[dict]], got: list[list[dict]], stream: dict) -> tuple[dict, list]:
    """(metrics, per-clip rows) of the compiled model's per-call outputs ``got`` against fp32's
    ``ref`` and each clip's known span (the module docstring's metrics)."""
    from tasks.audio.frames import span_iou, speech_spans

    rows, pr_all, pg_all = [], [], []
    for c, r, g in zip(clips, ref, got):
        pr = np.array([float(np.ravel(o[stream["output"]])[0]) for o in r])
        pg = np.array([float(np.ravel(o[stream["output"]])[0]) for o in g])
        sr, sg = speech_spans(pr, stream["frame"], stream["rate"]), speech_spans(pg, stream["frame"], stream["rate"])
        rows.append(
            {
                "text": c["text"],
                "voice": c["voice"],
                "lead": c["lead"],
                "tail": c["tail"],
                "frames": int(pr.size),
                "known_span": list(c["span"]),
                "spans_fp32": [list(s) for s in sr],
                "spans": [list(s) for s in sg],
                "agreement": float(((pr > 0.5) == (pg > 0.5)).mean()),
                "span_iou": span_iou(sg, c["span"]),
                "fp32_span_iou": span_iou(sr, c["span"]),
                "max_abs_error": float(np.abs(pr - pg).max()),
            }
        )
        pr_all.append(pr)
        pg_all.append(pg)
    pr, pg = np.concatenate(pr_all), np.concatenate(pg_all)
    return {
        "frame_agreement": float(((pr > 0.5) == (pg > 0.5)).mean()),
        "frames": int(pr.size),
        "speech_span_iou_mean": float(np.mean([x["span_iou"] for x in rows])),
        "fp32_speech_span_iou_mean": float(np.mean([x["fp32_span_iou"] for x in rows])),
        "probability_max_abs_error": float(np.abs(pr - pg).max()),
        "probability_correlation": float(np.corrcoef(pr, pg)[0, 1]) if pr.std() and pg.std() else 1.0,
    }, rows


def run(inputs, files, params, out: Path) -> dict:
    """Measure; write ``out/verify.json``. Returns {"backend", "samples"}."""
    from tasks.qnn import ep as qnn
    from tasks.qnn.compile_folder import read_back
    from tasks.qnn.run_arrays import cpu_sequences, htp_sequences

    binaries = read_back(inputs["compiled"], params["target"], inputs["qdq"])
    io = io_of(inputs["reference"])
    stream, d = io["stream"], params["data"]
    clips = clip_set(read_lines(files["data"], d["samples"]), d["voices"], d["seed"], d["noise"], stream)
    zero = first_state(io)
    seqs = [[{**c["seq"][0], **zero}, *c["seq"][1:]] for c in clips]
    rec = stream["recurrent"]
    ref = cpu_sequences(inputs["reference"] / "model.onnx", seqs, rec)
    got = (
        htp_sequences(inputs["compiled"] / "model_ctx.onnx", params["target"], seqs, rec)
        if params["backend"] == "htp"
        else cpu_sequences(inputs["qdq"] / "model.onnx", seqs, rec)
    )
    metrics, rows = score(clips, ref, got, stream)
    return common.write_report(
        out,
        {
            "backend": params["backend"],
            "target": params["target"],
            "task": params.get("task"),
            "decode": "vad",
            "metrics": metrics,
            "samples": rows,
            "binaries": binaries,
            **qnn.placement(inputs["compiled"]),
        },
    )


def key_extra(params: dict) -> dict:
    return {**common.target_key_extra(params), **key_material()}


STAGE = Stage(
    kind="verify",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "numpy"),
    run=run,
    params=(BACKEND, DATA_SAMPLES, VER_VOICES, VER_SEED, VER_NOISE, THRESHOLDS_PARAM),
    files={DATA_FILE: "data"},
    line_samples=("data",),
    wired=("target", "task"),
    key_exclude=("thresholds",),
    key_extra=key_extra,
    check=common.checker(THRESHOLDS),
    thresholds=THRESHOLDS,
    artifacts=common.VERIFY_ARTIFACTS,
)
