"""The audio family's recipe built through the real ``doit`` CLI: Silero VAD from the silero-vad
wheel (its If on the sample rate folded at export), its LSTM state carried call to call, verified
on the HTP simulator against fp32 and the known speech spans of espeak-ng clips (two clips here;
the recipe's own: 16, README figures)."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import REPO, Project, card_python, run_snippet
from llm_projects import assert_within_estimates, stage_manifests


@pytest.fixture(scope="module")
def vad(tmp_path_factory):
    root = tmp_path_factory.mktemp("vad")
    empty = root / "empty"
    empty.mkdir()
    p = Project(root / "proj", empty)
    (p.root / "recipes" / "data").mkdir()
    for f in ("calib-en.txt", "verify-en.txt"):
        shutil.copyfile(REPO / "recipes" / "data" / f, p.root / "recipes" / "data" / f)
    shutil.copyfile(REPO / "recipes" / "silero-vad-w8a16.yaml", p.root / "recipes" / "vad-full.yaml")
    (p.root / "recipes" / "silero-vad-w8a16.yaml").write_text(
        "extends: vad-full\nquantize: {calibration: {samples: 6}}\nverify: {data: {samples: 2}}\n"
    )
    p.doit("run", "build:silero-vad-w8a16")
    return p


def test_vad_streams_held_out_speech_on_htp_as_fp32_does(vad):
    r = json.loads((vad.root / "build" / "silero-vad-w8a16" / "verify.json").read_text())
    assert r["backend"] == "htp" and r["all_on_htp"] and r["task"] == "voice-activity-detection"
    m = r["metrics"]
    assert m["frame_agreement"] >= 0.98 and m["frames"] == sum(s["frames"] for s in r["samples"]) > 100
    assert m["speech_span_iou_mean"] >= 0.8 and m["fp32_speech_span_iou_mean"] >= 0.8
    assert [s["voice"] for s in r["samples"]] == ["en-029", "en-gb-x-rp"]
    for s in r["samples"]:
        a, b = s["known_span"]
        assert 0 < a < b and s["spans"], s  # speech found where espeak-ng spoke


def test_every_stage_stays_within_its_memory_estimate(vad):
    """The budget's promise for the audio family (issue 54): every stage's process tree peak is
    at most the estimate checked before it ran (its manifest's ``info["memory"]``)."""
    mans = stage_manifests(vad, "silero-vad-w8a16")
    assert {m["kind"] for m in mans.values()} >= {"download", "quantize", "compile", "verify"}
    assert_within_estimates(mans)


def test_the_if_is_folded_and_the_16_bit_convs_are_per_channel(vad):
    io = json.loads((vad.root / "build" / "silero-vad-w8a16" / "io.json").read_text())
    assert [i["name"] for i in io["inputs"]] == ["input", "state"] and io["stream"]["recurrent"] == {"state": "stateN"}
    export = next((vad.cache / "export").iterdir())
    steps = [s["kind"] for s in json.loads((export / "manifest.json").read_text())["info"]["steps"]]
    assert steps == ["constant-inputs", "static-dims", "fold-if", "opset"]
    q = next((vad.cache / "quantize").iterdir())
    over = json.loads((q / "manifest.json").read_text())["info"]["graphs"]["model.onnx"]["overrides"]
    assert len(over) == 1 and len(over[0]["conv_per_channel"]) == 2 and over[0]["other"] == []


def test_the_cards_snippet_streams_audio_as_written_on_the_simulator(vad, tmp_path):
    """The published card's "Use it" snippet, run in the bundle folder as written: two seconds
    made in it, streamed 512 samples a call (with 64 before them) with the LSTM state carried:
    62 calls, silence below 0.5."""
    vad.doit("run", "publish:silero-vad-w8a16")
    (code,) = card_python(vad.root / "dist" / "silero-vad-w8a16")
    last = run_snippet(code, vad.root / "dist" / "silero-vad-w8a16", tmp_path).strip().splitlines()[-1]
    words = last.split()
    assert words[:2] == ["62", "calls;"] and float(words[words.index("silence:") + 1]) < 0.5, last
