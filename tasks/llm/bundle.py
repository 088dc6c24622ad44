"""The bundle stage, the LLM implementation (the contract: tasks/stages/__init__.py): the join
of an LLM's parts (issue 22).

Each part is exported, calibrated, quantized and compiled by stages of its own
(``tasks/plan.py``); this stage writes what belongs to the whole model, from the parts'
export entries: ``export.json`` (every part's graph I/O, with each part's ``weight_bytes``
from its own export, and ``checkpoint_bytes_read`` summed over the parts), the host-side
embedding table (``embedding: host``) and ``genai_config.json`` (``tasks/llm/compile.py``
``write_bundle``). ``build/<recipe>/`` links it beside the parts' compile entries: the
same layout a whole-model compile wrote before the parts were stages.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..stages.common import target_key_extra

VERSION = 1
TOOLS = ()
#: the recipe keys of its section (``compile``) this implementation reads
PARAMS = ("weight_sharing",)
KEY_EXCLUDE = ("target",)  # the name; the key holds what it resolves to (key_extra)
key_extra = target_key_extra


def joined_description(export_dirs: list[Path]) -> dict:
    """The whole model's ``export.json`` from the parts' export folders (part k's folder
    first describes every part and writes part k): part 0's description with each part's row
    taken from that part's own export and ``checkpoint_bytes_read`` summed. Raises ValueError
    when the parts disagree on anything else (they come from different exports)."""
    descs = [json.loads((Path(d) / "export.json").read_text()) for d in export_dirs]
    out = dict(descs[0])
    out["parts"] = [d["parts"][k] for k, d in enumerate(descs)]
    if "checkpoint_bytes_read" in out:
        out["checkpoint_bytes_read"] = sum(d.get("checkpoint_bytes_read", 0) for d in descs)
    for k, d in enumerate(descs[1:], 1):
        rest = {n: v for n, v in d.items() if n not in ("parts", "checkpoint_bytes_read")}
        if rest != {n: v for n, v in out.items() if n not in ("parts", "checkpoint_bytes_read")}:
            raise ValueError(f"part {k}'s export.json describes another model or shape than part 0's")
    return out


def run(inputs, files, params, out: Path) -> dict:
    """Write the bundle's own files for ``params["parts"]`` parts from ``inputs["export.part{k}"]``
    (the parts' exports; ``inputs["compiled.part{k}"]`` are the parts' binaries, which
    ``build/`` links beside). Returns {"parts": P, "binary_bytes": total bytes of the parts'
    weight-shared (else per-graph) context binaries}."""
    from .compile import write_bundle

    P = params["parts"]
    desc = joined_description([inputs[f"export.part{k}"] for k in range(P)])
    write_bundle(desc, inputs["export.part0"], out, params)
    sub = "shared" if params.get("weight_sharing", True) else ""
    total = sum(b.stat().st_size for k in range(P)
                for b in (Path(inputs[f"compiled.part{k}"]) / sub / f"part{k}").glob("*.bin"))
    return {"parts": P, "binary_bytes": total}
