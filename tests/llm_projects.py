"""Projects holding the repo's tiny LLM recipes and the trained tiny Qwen2 (llm/, qnn/, sources/
and commands/ tests)."""

from __future__ import annotations

import shutil

from conftest import REPO, Project
from llm_fixtures import tiny_model

DATA = ["tasks/llm/data/tiny-corpus.txt", "recipes/data/prompts-tiny.txt", "recipes/data/ppl-tiny.txt"]

PARTS_RECIPE = """\
extends: tiny-qwen2-w8a16
description: tiny trained Qwen2 in {parts} parts
export: {{parts: {parts}}}
verify: {{data: {{samples: 2}}, max_new_tokens: 8}}
"""


def parts_project_at(root, tiny_bert, name: str = "tiny3", parts: int = 3) -> Project:
    """A project with the tiny trained Qwen2, its data files, ``tiny-qwen2-w8a16`` and recipe
    ``name`` extending it with ``parts`` parts (2 verify prompts of 8 tokens)."""
    proj = Project(root, tiny_bert)
    for rel in DATA:
        (proj.root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / rel, proj.root / rel)
    shutil.copyfile(REPO / "recipes" / "tiny-qwen2-w8a16.yaml", proj.root / "recipes" / "tiny-qwen2-w8a16.yaml")
    shutil.copytree(tiny_model("qwen2"), proj.root / ".fixtures" / "tiny-qwen2")
    proj.recipe(name, PARTS_RECIPE.format(parts=parts))
    return proj


def stage_manifests(proj, recipe: str) -> dict[str, dict]:
    """{stage: manifest} of every stage of ``recipe``'s last build in ``proj``
    (``build/<recipe>/stages.json`` names each stage's entry)."""
    import json
    from pathlib import Path

    st = json.loads((proj.root / "build" / recipe / "stages.json").read_text())
    return {name: json.loads((Path(row["entry"]) / "manifest.json").read_text()) for name, row in st.items()}


def assert_within_estimates(mans: dict[str, dict]) -> None:
    """Every stage's manifest holds the memory estimate checked before it ran and its measured
    process tree peak (``info["memory"]``, :func:`tasks.proc.budget.manifest_memory`), and the peak is
    at most the estimate: what fails when an estimate stops bounding (issue 54)."""
    over = {
        s: (m["info"]["memory"]["peak"], m["info"]["memory"]["estimate"])
        for s, m in mans.items()
        if not (0 < m["info"]["memory"]["peak"] <= (m["info"]["memory"]["estimate"] or 0))
    }
    assert not over, f"process tree peak over the estimate (bytes): {over}"
