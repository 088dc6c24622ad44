"""The LLM verify loads each part's sessions a bounded number of times (issue 35, item 2):
the tiny trained Qwen2 in 2 parts through the real doit CLI, then the stage's function again on
the same entries with the sessions counted where they are made (the session factories'
wrapper, ``verify_llm(wrap_sessions=...)``), at two generation lengths and two memory budgets."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from llm_projects import parts_project_at


def _counted(lists: list):
    """A ``wrap_sessions`` hook: each stream's factory records the graph paths it opens in a
    list of its own, appended to ``lists`` (the compiled side's first, then fp32's)."""
    def wrap(factory):
        made = []
        lists.append(made)

        def make(path):
            made.append(Path(path).relative_to(Path(path).parents[1]).as_posix())
            return factory(path)
        return make
    return wrap


def test_verify_loads_each_part_once_per_side_whatever_the_tokens(tmp_path, tiny_bert):
    """Through the stage: each side makes 4 sessions for 2 parts (prefill + decode each), the
    perplexity text riding in the same prefill passes. Again on the entries, counted in the
    factory: the teacher-forced fp32 side opens each graph once for 4 tokens as for 12, with
    one part resident; the compiled side too when its decode graphs fit the budget (here
    exactly), and a decode graph per token when nothing fits (the greedy side's next token
    needs the last part's output). The budget changes no figure: the report equals the
    stage's verify.json."""
    from tasks.llm.compare import verify_llm
    from tasks.llm.verify import joined_views

    proj = parts_project_at(tmp_path / "proj", tiny_bert, name="tiny2", parts=2)
    proj.recipe("tiny2-loads", "extends: tiny2\nverify: {backend: cpu-qdq, data: {samples: 3}}\n")
    proj.doit("run", "build:tiny2-loads")
    st = json.loads((proj.root / "build" / "tiny2-loads" / "stages.json").read_text())
    man = json.loads((Path(st["verify"]["entry"]) / "manifest.json").read_text())
    assert man["info"]["part_loads"] == {"compiled": 4, "reference": 4}, man["info"]
    stage_report = json.loads((proj.root / "build" / "tiny2-loads" / "verify.json").read_text())
    assert all(s["reference_distinct_tokens"] >= 3 for s in stage_report["samples"]), stage_report["samples"]

    inputs = {n: proj.cache / i["kind"] / i["key"] / "out" for n, i in man["inputs"].items()}
    files = {r: str(proj.root / f["path"]) for r, f in man["files"].items()}
    graphs = sorted(f"part{k}/{g}.onnx" for k in range(2) for g in ("prefill", "decode"))
    with tempfile.TemporaryDirectory() as tmp:
        views = joined_views(inputs, Path(tmp))
        decode_bytes = sum(f.stat().st_size for k in range(2) for f in (views["qdq"] / f"part{k}").iterdir()
                           if f.name.startswith("decode"))
        for K in (4, 12):
            params = {**man["params"], "max_new_tokens": K, "runtime": "runner"}  # genai: its own sessions
            made: list = []
            r = verify_llm(views, files, params, budget_bytes=decode_bytes, wrap_sessions=_counted(made))
            compiled, fp32 = made
            assert sorted(compiled) == graphs and sorted(fp32) == graphs, made  # each graph once per side
            assert r["_run"]["part_loads"] == {"compiled": 4, "reference": 4}
            assert r["_run"]["parts_resident"] == {"compiled": 2, "reference": 1}
            made = []
            r = verify_llm(views, files, params, budget_bytes=decode_bytes - 1, wrap_sessions=_counted(made))
            compiled, fp32 = made
            assert sorted(fp32) == graphs, fp32
            assert len(compiled) == 2 + 2 * (K - 1) and compiled.count("part1/decode.onnx") == K - 1, compiled
        r = verify_llm(views, files, man["params"], budget_bytes=None)
    same = json.loads(json.dumps({k: r[k] for k in ("metrics", "samples")}))
    assert same == {k: stage_report[k] for k in ("metrics", "samples")}
