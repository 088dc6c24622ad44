"""export, the LLM implementation (encoders: ``tasks/encoder/export.py``): prefill
(AR-``sequence_length``) and decode (AR-``decode_length``) graphs of one part over a fixed
context, in onnxruntime-genai's decoder-pipeline layout, written from the checkpoint one part and
one tensor at a time (:mod:`tasks.llm.pipeline_graphs`, :mod:`tasks.llm.part_weights`), plus the
tokenizer and config files. The estimated peak memory is checked before any work
(:mod:`tasks.llm.memory`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from tasks.contract.common import EXPORT_ARTIFACTS, copy_tokenizer
from tasks.contract.stage import Param, Stage
from tasks.contract.params import SEQUENCE_LENGTH
from tasks.llm.memory import plan_estimate

DECODE_LENGTH = Param("export", "decode_length", int, 1, "tokens per decode call (AR-1)", limits={"ge": 1, "le": 1})
CONTEXT_LENGTH = Param(
    "export", "context_length", int, 4096, "KV cache length + current tokens", limits={"ge": 2, "le": 1_048_576}
)
PARTS = Param("export", "parts", int, 1, "number of parts the layers are split into", limits={"ge": 1, "le": 64})
EMBEDDING = Param(
    "export",
    "embedding",
    Literal["first-part", "host"],
    "first-part",
    "token embedding Gather inside part 0, or on the host (embed_tokens.npy)",
)
LM_HEAD = Param("export", "lm_head", Literal["last-part"], "last-part", "final norm + LM head in the last part")
LAYOUT = Param(
    "export",
    "layout",
    Literal["genai-pipeline"],
    "genai-pipeline",
    "graph I/O that onnxruntime-genai's decoder pipeline drives: int32 input_ids, "
    "past_seq_len/total_seq_len, one [1,Hkv,C,d] KV buffer per layer updated in the graph, all "
    "prefill logits (tasks/llm/pipeline_graphs.py)",
)


def run(inputs, files, params, out: Path) -> dict:
    """Export part ``params["part"]`` of the checkpoint in ``inputs["source"]`` into ``out``:
    ``part{k}/{prefill,decode}.onnx`` + ``part{k}/weights.data``, ``export.json`` (every part's
    graph I/O; this part's ``weight_bytes``) and the tokenizer and config files. Returns
    {"llm": export.json's description, "parts": the part's wall time and peak RSS}. Raises
    ``tasks.llm.memory.NotEnoughMemory`` before work when the part cannot fit, ValueError for
    an unsupported family or activation, SourceError (one line) for a tokenizer larger than the
    embedding or a tensor that is absent or of another shape than the config implies
    (:func:`tasks.llm.checkpoint.config_shape_problem`)."""
    from tasks.sources import SourceError
    from tasks.sources.facts import check_vocabulary
    from tasks.llm.checkpoint import config_shape_problem
    from tasks.llm.memory import check_stage, held_bytes
    from tasks.llm.pipeline_graphs import export_llm

    src = inputs["source"]
    check_vocabulary(src)
    if bad := config_shape_problem(src):
        raise SourceError(bad)
    check_stage(
        "export",
        json.loads((src / "config.json").read_text(encoding="utf-8")),
        parts=params["parts"],
        seq_len=params["sequence_length"],
        context_len=params["context_length"],
        embed_in_part=params["embedding"] == "first-part",
        part=params["part"],
        held=held_bytes(False),
    )
    meter: list = []
    info = export_llm(
        src,
        out,
        seq_len=params["sequence_length"],
        context_len=params["context_length"],
        parts=params["parts"],
        embed={"first-part": "part0", "host": "separate"}[params["embedding"]],
        meter=meter,
        only_parts={params["part"]},
    )
    copy_tokenizer(src, out)
    if not (out / "tokenizer.json").is_file():
        info["tokenizer_json"] = write_tokenizer_json(src, out)
    return {"llm": info, "parts": meter}


def write_tokenizer_json(src: Path, out: Path) -> str:
    """Write ``out/tokenizer.json`` for a checkpoint whose tokenizer comes without one (a slow
    tokenizer: ``vocab.json`` + ``merges.txt``, or a SentencePiece ``tokenizer.model``): the
    fast tokenizer transformers converts from those files (``AutoTokenizer(use_fast=True)``,
    ``convert_slow_tokenizer``), saved by the ``tokenizers`` library, the one format Genie
    reads (``genie_config.json``'s ``tokenizer.path``) and onnxruntime-genai reads first.
    Returns how it was made ("converted from <files>"), or why not ("no fast tokenizer: ..."),
    kept in the manifest's info (``llm.tokenizer_json``); then the bundle refuses Genie in one
    line (:func:`tasks.llm.bundle.write_genie`).
    Before, such an export had no tokenizer.json and the Genie bundle failed with advice to
    drop the upstream entry, which rebuilt the same entry (issue 51 case 6)."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src), use_fast=True, local_files_only=True)
    except Exception as e:  # no tokenizer files at all: the stages that read one say so
        return f"no fast tokenizer: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
    if not tok.is_fast:
        return f"no fast tokenizer: transformers has no converter for {type(tok).__name__}"
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    found = [n for n in ("vocab.json", "merges.txt", "tokenizer.model") if (src / n).is_file()]
    return f"converted from {', '.join(found)}"


def preflight(recipe) -> list[tuple[str, str]]:
    """The context holds the prefill window and more: sequence_length < context_length."""
    e = recipe.export
    if e.sequence_length >= e.context_length:
        return [
            (
                "export.context_length",
                f"expected sequence_length < context_length, found {e.sequence_length} >= {e.context_length}",
            )
        ]
    return []


STAGE = Stage(
    kind="export",
    module=__name__,
    version=2,  # 2: one part per stage
    tools=("torch", "transformers", "onnx", "numpy", "safetensors"),
    run=run,
    params=(SEQUENCE_LENGTH, DECODE_LENGTH, CONTEXT_LENGTH, PARTS, EMBEDDING, LM_HEAD, LAYOUT),
    wired=("part",),
    artifacts=EXPORT_ARTIFACTS,
    preflight=preflight,
    memory_estimate=plan_estimate,
)
