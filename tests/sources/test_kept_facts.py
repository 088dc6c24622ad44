"""A Hub model's kept facts (``recipes/models/``) are the facts of a commit, not of the text a
recipe writes for its revision (issue 51 case 1): a snapshot refused under the pinned commit is
refused as well under a branch that names the same commit, so no download entry ever holds it
(both names share one download key: the commit). Through the real doit CLI, on the tiny BERT in
a fake local Hugging Face cache (offline)."""

from __future__ import annotations

import json

from conftest import TINY_RECIPE, Project
from console_cli import doit as console
from hub_cache import COMMIT, fake_hub_cache

REPO = "acme/tiny-bert"
PINNED = TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
    "source: {path: models/tiny-bert}", f"source: {{hf: {REPO}, revision: '{COMMIT}'}}"
)


def test_a_snapshot_refused_at_its_commit_is_refused_under_a_branch_naming_it(tmp_path, tiny_bert):
    p = Project(tmp_path / "proj", tiny_bert)
    p.env["HF_HUB_CACHE"] = str(fake_hub_cache(tmp_path / "hub", REPO, tiny_bert))  # refs/main = COMMIT
    (p.root / "recipes" / "models").mkdir()
    (p.root / "recipes" / "models" / "tiny-bert.json").write_text(
        json.dumps({"repo": REPO, "revision": COMMIT, "config": {"hidden_size": 64}})
    )  # the snapshot's is 32
    p.recipe("pinned", PINNED)
    p.recipe("child", "extends: pinned\nsource: {revision: main}\n")
    want = (
        f"SourceError: {REPO}@{COMMIT[:12]} config.json key 'hidden_size': expected 64 (kept in "
        f"recipes/models/tiny-bert.json), found 32"
    )
    for name in ("child", "pinned"):  # the branch first: before, it cached the snapshot, then a hit for the pin
        run = console(p, "run", f"download:{name}")
        out = run.stdout + run.stderr
        assert run.returncode != 0 and "Traceback" not in out, out
        assert [ln for ln in out.splitlines() if ln.startswith(f"download:{name}  SourceError")] == [
            f"download:{name}  {want}"
        ], out
        assert p.entries("download") == []
    facts = p.root / "recipes" / "models" / "tiny-bert.json"
    facts.write_text(facts.read_text().replace('"hidden_size": 64', '"hidden_size": 32'))  # facts that agree
    assert console(p, "run", "download:child").returncode == 0 and len(p.entries("download")) == 1
    facts.write_text(facts.read_text().replace('"hidden_size": 32', '"hidden_size": 48'))  # edited: checked again
    run = console(p, "run", "download:pinned")
    assert run.returncode != 0 and "found 32" in run.stdout and "cache hit" not in run.stdout, run.stdout
