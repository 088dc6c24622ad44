"""verify, the vision implementation: the compiled model (``backend: htp``: the EPContext model
on the HTP simulator; ``cpu-qdq``: the QDQ graph on the CPU EP) and the fp32 export run on the
held-out set (the first ``data.samples`` lines of ``data.file`` in ``data.fonts`` at
``data.sizes``, then ``data.photos``; :func:`tasks.vision.family.samples`), their outputs decoded
as the export's ``io.json`` says (:mod:`tasks.vision.decode`) and scored by the task:

- ``ctc`` (text): ``text_exact_fp32``, the share of lines whose text equals fp32's (spaces
  ignored); ``text_exact_truth``, equal to the rendered line; ``cer_truth_mean``, the mean
  character error rate against it (spaces ignored); ``fp32_text_exact_truth``, fp32's own;
- ``db`` (boxes): ``boxes_matched_fp32``, the share of fp32's boxes (over every sample) that a
  box of the compiled model's matches at IoU > 0.5; ``lines_found_truth``, the share of the
  rendered lines whose ink box lies (90 % of it) inside a detected box (pages only:
  :func:`tasks.vision.decode.covered`); ``fp32_lines_found_truth``;
- ``cls`` (orientation): ``cls_accuracy`` against the known turn; ``cls_agreement_fp32``;
  ``fp32_cls_accuracy``.

Every sample's decoded output and the truth are in ``verify.json``. Thresholds judge, they are
not in the key."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tasks.contract import common
from tasks.contract.params import BACKEND, DATA_FILE, DATA_SAMPLES, THRESHOLDS as THRESHOLDS_PARAM
from tasks.contract.stage import Stage, Threshold
from tasks.datafiles import read_lines
from tasks.proc import lazy
from tasks.vision.family import VER_FONTS, VER_PHOTOS, VER_SIZES, file_lines, io_of, key_files, samples

np = lazy.module("numpy")


def _share(name, per_sample, what):
    return Threshold(name, "min", per_sample, what, "a share", 0.0, True, 1.0)


THRESHOLDS = (
    _share("text_exact_fp32", "exact_fp32", "share of lines whose text equals fp32's (spaces ignored)"),
    _share("text_exact_truth", "exact_truth", "share of lines whose text equals the rendered line (spaces ignored)"),
    Threshold(
        "cer_truth_mean",
        "max",
        "cer_truth",
        "mean character error rate against the rendered line",
        "an error rate",
        0.0,
        True,
        math.inf,
    ),
    _share("boxes_matched_fp32", "matched_fp32", "share of fp32's text boxes matched at IoU > 0.5"),
    _share("lines_found_truth", "found_truth", "share of the rendered lines inside a detected box"),
    _share("cls_accuracy", "correct", "share of lines whose orientation is the known one"),
    _share("cls_agreement_fp32", "agree_fp32", "share of lines whose orientation equals fp32's"),
)


def _outputs(params, inputs, feeds: list[dict]) -> tuple[list, list]:
    """(fp32 outputs, compiled outputs): each a list of the graph's first output per feed."""
    from tasks.qnn.run_arrays import cpu_sequences, htp_sequences

    ref = [s[0] for s in cpu_sequences(inputs["reference"] / "model.onnx", [[f] for f in feeds])]
    if params["backend"] == "htp":
        got = [
            s[0] for s in htp_sequences(inputs["compiled"] / "model_ctx.onnx", params["target"], [[f] for f in feeds])
        ]
    else:
        got = [s[0] for s in cpu_sequences(inputs["qdq"] / "model.onnx", [[f] for f in feeds])]
    first = lambda outs: [next(iter(o.values())) for o in outs]  # noqa: E731  (each graph has one output)
    return first(ref), first(got)


def score(decode: str, sets: list[dict], ref: list, got: list, meta: dict, scale: float = 1.0) -> tuple[dict, list]:
    """(metrics, per-sample rows) of compiled outputs ``got`` against fp32's ``ref`` and the truth
    of each of ``sets``' samples (:func:`tasks.vision.family.samples`), by ``decode``."""
    from tasks.vision import decode as D

    rows = []
    for s, r, g in zip(sets, ref, got):
        row = {"text": s["text"], "font": s["font"], "size": s["size"]}
        if decode == "ctc":
            alphabet = D.characters(meta)
            fr, gr = D.ctc_greedy(r, alphabet), D.ctc_greedy(g, alphabet)
            t = D.squeeze_spaces(s["truth"])
            row.update(
                fp32=fr,
                got=gr,
                exact_fp32=float(D.squeeze_spaces(fr) == D.squeeze_spaces(gr)),
                exact_truth=float(D.squeeze_spaces(gr) == t),
                fp32_exact_truth=float(D.squeeze_spaces(fr) == t),
                cer_truth=D.cer(D.squeeze_spaces(gr), t),
            )
        elif decode == "db":
            fb, gb = D.db_boxes(r), D.db_boxes(g)
            row.update(
                fp32_boxes=len(fb),
                got_boxes=len(gb),
                matched=D.matched(fb, gb),
                matched_fp32=D.matched(fb, gb) / len(fb) if fb else 1.0,
                boxes=[[round(v, 1) for v in b] for b in gb],
            )
            if s["truth"] is not None:
                row.update(
                    truth_boxes=len(s["truth"]),
                    truth_found=D.covered(s["truth"], gb),
                    fp32_truth_found=D.covered(s["truth"], fb),
                    found_truth=D.covered(s["truth"], gb) / max(1, len(s["truth"])),
                )
        else:
            fl, gl = D.CLS_LABELS[int(np.argmax(r))], D.CLS_LABELS[int(np.argmax(g))]
            row.update(
                truth=s["truth"],
                fp32=fl,
                got=gl,
                correct=float(gl == s["truth"]),
                agree_fp32=float(gl == fl),
                fp32_correct=float(fl == s["truth"]),
                p_got=round(float(np.max(g)), 4),
            )
        rows.append(row)
    mean = lambda k: float(np.mean([x[k] for x in rows if k in x]))  # noqa: E731
    if decode == "ctc":
        m = {
            "text_exact_fp32": mean("exact_fp32"),
            "text_exact_truth": mean("exact_truth"),
            "fp32_text_exact_truth": mean("fp32_exact_truth"),
            "cer_truth_mean": mean("cer_truth"),
        }
    elif decode == "db":
        pages = [x for x in rows if "truth_boxes" in x]
        m = {
            "boxes_matched_fp32": sum(x["matched"] for x in rows) / max(1, sum(x["fp32_boxes"] for x in rows)),
            "boxes_fp32": sum(x["fp32_boxes"] for x in rows),
            "boxes_compiled": sum(x["got_boxes"] for x in rows),
        }
        if pages:
            n = max(1, sum(x["truth_boxes"] for x in pages))
            m.update(
                lines_found_truth=sum(x["truth_found"] for x in pages) / n,
                fp32_lines_found_truth=sum(x["fp32_truth_found"] for x in pages) / n,
            )
    else:
        m = {
            "cls_accuracy": mean("correct"),
            "cls_agreement_fp32": mean("agree_fp32"),
            "fp32_cls_accuracy": mean("fp32_correct"),
        }
    return m, rows


def run(inputs, files, params, out: Path) -> dict:
    """Measure; write ``out/verify.json``. Returns {"backend", "samples"}."""
    from tasks.qnn import ep as qnn
    from tasks.qnn.compile_folder import read_back

    binaries = read_back(inputs["compiled"], params["target"], inputs["qdq"])
    io = io_of(inputs["reference"])
    meta_file = inputs["reference"] / "metadata.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    d = params["data"]
    lines = read_lines(files["data"], d["samples"])
    sets = samples(
        io["decode"],
        lines,
        d["fonts"],
        d["sizes"],
        io["preprocess"],
        tuple(d.get("photos") or ()),
        pool=file_lines(files["data"]),
    )
    name = io["inputs"][0]["name"]
    ref, got = _outputs(params, inputs, [{name: s["x"]} for s in sets])
    metrics, rows = score(io["decode"], sets, ref, got, meta)
    return common.write_report(
        out,
        {
            "backend": params["backend"],
            "target": params["target"],
            "task": params.get("task"),
            "decode": io["decode"],
            "metrics": metrics,
            "samples": rows,
            "binaries": binaries,
            **qnn.placement(inputs["compiled"]),
        },
    )


def key_extra(params: dict) -> dict:
    from tasks.store import digest
    from tasks.vision.inputs import photo_file

    return {
        **common.target_key_extra(params),
        "fonts": key_files(params["data"]["fonts"]),
        "photos": {p: digest.file_digest(photo_file(p)) for p in params["data"].get("photos") or ()},
    }


STAGE = Stage(
    kind="verify",
    module=__name__,
    version=1,
    tools=("onnxruntime", "onnxruntime-qnn", "qnn-sdk", "numpy", "pillow"),
    run=run,
    params=(BACKEND, DATA_SAMPLES, VER_FONTS, VER_SIZES, VER_PHOTOS, THRESHOLDS_PARAM),
    files={DATA_FILE: "data"},
    line_samples=("data",),
    wired=("target", "task"),
    key_exclude=("thresholds",),
    key_extra=key_extra,
    check=common.checker(THRESHOLDS),
    thresholds=THRESHOLDS,
    artifacts=common.VERIFY_ARTIFACTS,
)
