"""The patch stage (every model family): apply the recipe's named, versioned graph rewrites (``tasks/patches/``) in
order.

Every ``*.onnx`` graph in the input folder is patched (an LLM export has a prefill and a
decode graph per part); other files (tokenizer, config, external data of untouched graphs)
are copied. A graph that no step changes is copied byte for byte, so a patch that does not
apply leaves the output digest, and with it every downstream key, unchanged (early cut-off).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks import patches
from tasks.store import digest
from tasks.qnn.graphs import list_graphs, load_model, save_model
from tasks.contract.stage import Stage


def run(inputs, files, params, out: Path) -> dict:
    """Apply ``params["steps"]`` ([{name, version, params}]) to each graph of
    ``inputs["model"]``. Returns {graph: [{patch, changed, note}]}. Raises KeyError for an
    unknown patch and ValueError when a step's registered version differs from the plan's."""
    src = inputs["model"]
    report = {}
    written = set()
    for g in list_graphs(src):
        rel = g.relative_to(src)
        model = load_model(g)
        changed_any = False
        log = []
        for step in params["steps"]:
            p = patches.get(step["name"])
            if p.version != step["version"]:
                raise ValueError(f"patch {p.name}: plan wants version {step['version']}, registry has {p.version}")
            res = p.fn(model, **step["params"])
            model = res.model
            changed_any |= res.changed
            log.append(
                {
                    "patch": p.name,
                    "changed": res.changed,
                    "note": res.note,
                    **({"counts": res.counts} if res.counts else {}),
                }
            )
            print(
                f"    patch {p.name} on {rel.as_posix()}: {'changed' if res.changed else 'not applicable'}"
                f"{' - ' + res.note if res.note else ''}",
                flush=True,
            )
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        if changed_any:
            save_model(model, out / rel)
            written.add(rel.as_posix())
            written.add(rel.as_posix() + ".data")
        report[rel.as_posix()] = log
    for f in digest.list_files(src):
        rel = f.relative_to(src)
        if rel.as_posix() not in written and not (out / rel).exists():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out / rel)
    return {"patches": report}


STAGE = Stage(
    kind="patch", module=__name__, version=1, tools=("onnx", "onnxruntime"), run=run, wired=("steps",)
)  # the recipe's ``patches`` (pre- or post-quantize) as the plan resolves them
