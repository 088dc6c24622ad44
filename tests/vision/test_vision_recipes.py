"""The vision family's recipes built through the real ``doit`` CLI, on the real PP-OCR graphs of
the rapidocr-onnxruntime wheel, verified on the HTP simulator with small held-out sets (the
repository's recipes, their verify sets cut: the full sets are the recipes' own, README figures),
published, and read back as a page through ``scripts/ocr_page.py``. One module fixture builds the
three with smaller calibration sets too (17 minutes at a load average of 35 on 2 cores; the
page test 8 minutes there: the simulator's inference dominates)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, Project, card_python, run_snippet
from llm_projects import assert_within_estimates, stage_manifests

SMALL = {  # recipe -> its calibration and verify sets here (the recipes': 32 / 20 lines, 4 / 3 pages + a photo,
    # 32 / 32 lines)
    "ppocrv4-rec-w8a16": "quantize: {calibration: {samples: 12}}\nverify: {data: {samples: 3}}",
    "ppocrv4-det-w8a16": "quantize: {calibration: {samples: 2}}\nverify: {data: {samples: 1, photos: []}}",
    "ppocr-cls-w8a16": "quantize: {calibration: {samples: 8}}\nverify: {data: {samples: 4}}",
}


@pytest.fixture(scope="module")
def ocr(tmp_path_factory):
    root = tmp_path_factory.mktemp("ocr")
    empty = root / "empty"
    empty.mkdir()
    p = Project(root / "proj", empty)
    (p.root / "recipes" / "data").mkdir()
    for f in ("ocr-lines-calib.txt", "ocr-lines-verify.txt"):
        shutil.copyfile(REPO / "recipes" / "data" / f, p.root / "recipes" / "data" / f)
    for name, small in SMALL.items():
        shutil.copyfile(REPO / "recipes" / f"{name}.yaml", p.root / "recipes" / f"{name}-full.yaml")
        (p.root / "recipes" / f"{name}.yaml").write_text(f"extends: {name}-full\n{small}\n")
    p.doit("run", *[f"build:{n}" for n in SMALL])
    for n in SMALL:
        p.doit("run", f"publish:{n}")
    return p


def test_every_stage_stays_within_its_memory_estimate(ocr):
    """The budget's promise for the vision family (issue 54): every stage's process tree peak
    is at most the estimate checked before it ran (its manifest's ``info["memory"]``)."""
    for n in SMALL:
        mans = stage_manifests(ocr, n)
        assert {m["kind"] for m in mans.values()} >= {"download", "quantize", "compile", "verify"}, n
        assert_within_estimates(mans)


def _verify(p: Project, name: str) -> dict:
    return json.loads((p.root / "build" / name / "verify.json").read_text())


def test_rec_reads_the_held_out_lines_as_fp32_does_every_node_on_htp(ocr):
    r = _verify(ocr, "ppocrv4-rec-w8a16")
    assert r["backend"] == "htp" and r["all_on_htp"] and r["cpu_nodes"] == {}
    assert [s["text"] for s in r["samples"]] == ["Birds fly south.", "The train leaves", "at seven. A quiet"]
    assert [s["got"] for s in r["samples"]] == [s["text"] for s in r["samples"]]  # the rendered lines, read
    assert r["metrics"]["text_exact_fp32"] == 1.0 and r["metrics"]["cer_truth_mean"] == 0.0
    io = json.loads((ocr.root / "build" / "ppocrv4-rec-w8a16" / "io.json").read_text())
    assert io["inputs"] == [{"name": "x", "dtype": "float", "shape": [1, 3, 48, 320]}]
    assert io["outputs"][0]["shape"] == [1, 40, 6625] and io["metadata"] == ["character"]


def test_det_finds_fp32_s_boxes_and_cls_every_orientation(ocr):
    d = _verify(ocr, "ppocrv4-det-w8a16")
    assert d["metrics"]["boxes_matched_fp32"] == 1.0 and d["metrics"]["boxes_fp32"] >= 10
    assert d["metrics"]["lines_found_truth"] == 1.0 and d["all_on_htp"]
    c = _verify(ocr, "ppocr-cls-w8a16")
    assert [s["truth"] for s in c["samples"]] == ["0", "180", "0", "180"]
    assert c["metrics"] == {"cls_accuracy": 1.0, "cls_agreement_fp32": 1.0, "fp32_cls_accuracy": 1.0}


def test_the_catalog_and_the_card_show_task_licence_metric_and_how_to_run_it(ocr):
    ocr.doit("run", "catalog")
    rows = {r["name"]: r for r in json.loads((ocr.root / "catalog" / "catalog.json").read_text())["recipes"]}
    rec = rows["ppocrv4-rec-w8a16"]
    assert (rec["task"], rec["family"], rec["state"]) == ("text-recognition", "vision", "verified")
    assert rec["license"] == "Apache-2.0 (package metadata, License; no licence file in the wheel)"
    assert rec["source"]["file"] == "models/ch_PP-OCRv4_rec_infer.onnx" and rec["source"]["package_version"] == "1.4.4"
    assert rec["verify"]["x-elite"]["metrics"]["text_exact_fp32"] == 1.0
    card = (ocr.root / "dist" / "ppocrv4-rec-w8a16" / "README.md").read_text()
    assert "License: Apache-2.0 (package metadata, License; no licence file in the wheel)." in card
    assert "## How to run it" in card and "Preprocessing: an RGB image, scale to 48 px high" in card
    assert "| text_exact_fp32 | 1.000000 | 0.95 |" in card
    shipped = sorted(f.name for f in (ocr.root / "dist" / "ppocrv4-rec-w8a16").iterdir())
    assert {"io.json", "metadata.json", "model_ctx.onnx", "model_ctx_qnn.bin"} <= set(shipped)
    # parameters: paddle2onnx writes PP-OCR's weights as Constant nodes (the cls row said 0)
    got = {n: rows[n]["parameters"] for n in SMALL}
    assert got == {"ppocrv4-rec-w8a16": 2_690_352, "ppocrv4-det-w8a16": 1_171_841, "ppocr-cls-w8a16": 133_700}, got


def test_the_page_pipeline_reads_a_page_through_the_published_bundles(ocr, tmp_path):
    out = tmp_path / "page.json"
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "ocr_page.py"),
            "--dist",
            str(ocr.root / "dist"),
            "--lines",
            "2",
            "--json",
            str(out),
        ],
        env=ocr.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    assert res["npu"]["lines"] == ["Birds fly south.", "The train leaves"]
    assert res["cer_vs_fp32"] == 0.0 and res["cer_vs_truth"] == {"npu": 0.0, "fp32": 0.0}
    assert "character error rate vs the fp32 pipeline's text: 0.0000" in p.stdout


def test_each_cards_snippet_runs_as_written_on_the_simulator(ocr, tmp_path):
    """The "Use it" snippet of each published card, run in its bundle folder as written: it draws
    a line of text, preprocesses it as io.json says and reads the output: rec reads the line,
    det finds text where it was drawn, cls says it is upright."""
    said = {}
    for name in SMALL:
        (code,) = card_python(ocr.root / "dist" / name)
        said[name] = run_snippet(code, ocr.root / "dist" / name, tmp_path).strip().splitlines()[-1]
    assert said["ppocrv4-rec-w8a16"].startswith("text: ") and "".join(said["ppocrv4-rec-w8a16"][6:].split()) == (
        "Hello2026"
    ), said
    assert said["ppocr-cls-w8a16"].startswith("turned by 0 degrees;"), said
    pixels = int(said["ppocrv4-det-w8a16"].split()[2])
    assert said["ppocrv4-det-w8a16"].startswith("text pixels: ") and pixels > 500, said
