"""The vision family's declaration as the recipe layer sees it: its verify bars (declared once,
with ranges) and the default bars a recipe without ``verify.thresholds`` gets."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from tasks.contract import implementation
from tasks.recipe.load import load_recipe


def test_vision_verify_declares_its_seven_bars():
    assert [t.name for t in implementation("verify", "vision").thresholds] == [
        "text_exact_fp32",
        "text_exact_truth",
        "cer_truth_mean",
        "boxes_matched_fp32",
        "lines_found_truth",
        "cls_accuracy",
        "cls_agreement_fp32",
    ]


@pytest.mark.parametrize(
    "name, bars",
    [
        ("ppocrv4-rec-w8a16", {"text_exact_fp32": 0.95}),
        ("ppocrv4-det-w8a16", {"boxes_matched_fp32": 0.97}),
        ("ppocr-cls-w8a16", {"cls_accuracy": 1.0}),
    ],
)
def test_a_vision_recipe_without_bars_gets_the_bar_its_shipped_recipe_sets(tmp_path, name, bars):
    """Per decode (ctc, db, cls), the family's default is the bar the repo's recipe states."""
    text = (REPO / "recipes" / f"{name}.yaml").read_text()
    assert re.search(r"^  thresholds: .*\n", text, re.M), name
    (tmp_path / f"{name}.yaml").write_text(re.sub(r"^  thresholds: .*\n", "", text, flags=re.M))
    assert load_recipe(tmp_path / f"{name}.yaml").verify.thresholds == bars
