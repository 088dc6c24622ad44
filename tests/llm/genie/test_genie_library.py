"""``bundle.runtimes: [genie]`` without ``libGenie.so`` is a load error naming where it was looked
for (issue 51 case 5: it was reported after five stages as a config Genie's parser refused).
Through the real doit CLI, with an ``onnxruntime_qnn`` package on PYTHONPATH that lacks the
library (the wheel in the venv is left alone)."""

from __future__ import annotations

from console_cli import doit as console
from llm_projects import parts_project_at


def test_a_missing_libgenie_is_a_load_error(tmp_path, tiny_bert):
    p = parts_project_at(tmp_path / "proj", tiny_bert, "tiny1", parts=1)
    fake = tmp_path / "site" / "onnxruntime_qnn"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    p.env["PYTHONPATH"] = str(tmp_path / "site")
    p.recipe("g", "extends: tiny-qwen2-w8a16\nbundle: {runtimes: [genai, genie]}\n")
    run = console(p, "run", "build:g")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "Traceback" not in out, out
    assert p.entries("download") == [] and p.entries("export") == []
    want = (
        f"bundle.runtimes: expected libGenie.so for runtime genie (onnxruntime-qnn's wheel ships it), "
        f"found none at {fake / 'libGenie.so'}"
    )
    assert any(ln.strip() == want for ln in out.splitlines()), out
