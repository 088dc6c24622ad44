"""The audio family's declaration as the recipe layer sees it: its verify bars (declared once,
with ranges) and the default bar a recipe without ``verify.thresholds`` gets."""

from __future__ import annotations

import re

from conftest import REPO

from tasks.contract import implementation
from tasks.recipe.load import load_recipe


def test_audio_verify_declares_its_three_bars():
    assert [t.name for t in implementation("verify", "audio").thresholds] == [
        "frame_agreement",
        "speech_span_iou_mean",
        "probability_max_abs_error",
    ]


def test_the_vad_recipe_without_bars_gets_the_bar_it_ships_with(tmp_path):
    text = (REPO / "recipes" / "silero-vad-w8a16.yaml").read_text()
    assert re.search(r"^  thresholds: .*\n", text, re.M)
    (tmp_path / "silero-vad-w8a16.yaml").write_text(re.sub(r"^  thresholds: .*\n", "", text, flags=re.M))
    assert load_recipe(tmp_path / "silero-vad-w8a16.yaml").verify.thresholds == {"frame_agreement": 0.98}
