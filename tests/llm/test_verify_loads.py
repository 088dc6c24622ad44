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
    """Through the stage: the compiled side makes 4 sessions for 2 parts (prefill + decode
    each), the teacher-forced fp32 side 2 (its prefill graphs: the compiled tokens go through
    them with the prompt), the perplexity text riding in the same prefill passes. Again on the
    entries, counted in the factory: the fp32 side opens each prefill graph once for 4 tokens as
    for 12, with one part resident; the compiled side each graph once when its decode sessions and KV caches fit the
    budget (here exactly), and a decode graph per token when nothing fits (the greedy side's next token
    needs the last part's output). The budget changes no figure: the report equals the
    stage's verify.json."""
    from tasks.llm.boundary import kv_cache
    from tasks.llm.compare import SESSION_BYTES_PER_FILE_BYTE, resident_bytes, verify_llm
    from tasks.llm.verify import joined_views

    proj = parts_project_at(tmp_path / "proj", tiny_bert, name="tiny2", parts=2)
    proj.recipe("tiny2-loads", "extends: tiny2\nverify: {backend: cpu-qdq, data: {samples: 3}}\n")
    proj.doit("run", "build:tiny2-loads")
    st = json.loads((proj.root / "build" / "tiny2-loads" / "stages.json").read_text())
    man = json.loads((Path(st["verify"]["entry"]) / "manifest.json").read_text())
    assert man["info"]["part_loads"] == {"compiled": 4, "reference": 2}, man["info"]
    stage_report = json.loads((proj.root / "build" / "tiny2-loads" / "verify.json").read_text())
    assert all(s["reference_distinct_tokens"] >= 3 for s in stage_report["samples"]), stage_report["samples"]

    inputs = {n: proj.cache / i["kind"] / i["key"] / "out" for n, i in man["inputs"].items()}
    files = {r: str(proj.root / f["path"]) for r, f in man["files"].items()}
    graphs = sorted(f"part{k}/{g}.onnx" for k in range(2) for g in ("prefill", "decode"))
    with tempfile.TemporaryDirectory() as tmp:
        views = joined_views(inputs, Path(tmp))
        decode_bytes = sum(
            f.stat().st_size
            for k in range(2)
            for f in (views["qdq"] / f"part{k}").iterdir()
            if f.name.startswith("decode")
        )
        desc = json.loads((views["reference"] / "export.json").read_text())
        assert {t["dtype"] for p in desc["parts"] for t in p["decode"]["inputs"] if kv_cache(t["name"])} == {
            "uint8"
        }  # the KV cache as the quantized graphs take it (quantize.kv_bits: 8)
        kv = 3 * desc["num_layers"] * 2 * desc["num_kv_heads"] * desc["context_len"] * desc["head_dim"] * 1
        need = int(decode_bytes * SESSION_BYTES_PER_FILE_BYTE["cpu-qdq"]) + kv  # 3 prompts' KV caches
        assert resident_bytes(lambda i, kind: views["qdq"] / f"part{i}" / f"{kind}.onnx", 2, "cpu-qdq", 3, desc) == need
        for K in (4, 12):
            params = {**man["params"], "max_new_tokens": K, "runtime": "runner"}  # genai: its own sessions
            made: list = []
            r = verify_llm(views, files, params, budget_bytes=need, wrap_sessions=_counted(made))
            compiled, fp32 = made
            assert sorted(compiled) == graphs, made  # each graph once
            assert sorted(fp32) == [g for g in graphs if g.endswith("prefill.onnx")], made  # teacher forced: prefill
            assert r["_run"]["part_loads"] == {"compiled": 4, "reference": 2}
            assert r["_run"]["parts_resident"] == {"compiled": 2, "reference": 1}
            made = []
            r = verify_llm(views, files, params, budget_bytes=need - 1, wrap_sessions=_counted(made))
            compiled, fp32 = made
            assert sorted(fp32) == [g for g in graphs if g.endswith("prefill.onnx")], fp32
            assert len(compiled) == 2 + 2 * (K - 1) and compiled.count("part1/decode.onnx") == K - 1, compiled
        r = verify_llm(views, files, man["params"], budget_bytes=None)
    same = json.loads(json.dumps({k: r[k] for k in ("metrics", "samples")}))
    assert same == {k: stage_report[k] for k in ("metrics", "samples")}
