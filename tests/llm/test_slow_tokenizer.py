"""A checkpoint whose tokenizer comes as ``vocab.json`` + ``merges.txt`` alone (a slow BPE
tokenizer, no ``tokenizer.json``) exports a ``tokenizer.json`` converted from it, the one
tokenizer format Genie reads (issue 51 case 6: the Genie bundle failed with advice to drop the
export entry, which rebuilt the same entry). Through the real doit CLI, on the tiny trained
Qwen2 with its tokenizer rewritten in the slow files."""

from __future__ import annotations

import json

from llm_projects import parts_project_at

TEXT = "The quick brown fox jumps over the lazy dog, twice."


def test_a_slow_tokenizer_exports_a_tokenizer_json_that_encodes_as_it_does(tmp_path, tiny_bert):
    from transformers import AutoTokenizer

    p = parts_project_at(tmp_path / "proj", tiny_bert, "tiny1", parts=1)
    src = p.root / ".fixtures" / "tiny-qwen2"
    fast = json.loads((src / "tokenizer.json").read_text())
    (src / "vocab.json").write_text(json.dumps(fast["model"]["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in fast["model"]["merges"]]
    (src / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    (src / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "Qwen2Tokenizer"}))
    (src / "tokenizer.json").unlink()
    slow = AutoTokenizer.from_pretrained(str(src), use_fast=False)
    p.doit("run", "export.part0:tiny1")
    (entry,) = p.entries("export")
    out = p.cache / "export" / entry / "out"
    assert (out / "tokenizer.json").is_file(), sorted(f.name for f in out.iterdir())
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(TEXT).ids == slow.encode(TEXT)
