"""What a model card tells a user to run the bundle (:func:`usage_lines`, for :mod:`.card`):
each shipped graph's inputs and outputs (:func:`io_tables`: name, dtype, shape, meaning, and a
quantized tensor's scale and zero point, read from the shipped files themselves), the
preprocessing (tokenizer, padding, pooling; an LLM's prompt window and chat template), one
runnable snippet per runtime the bundle serves (:func:`tasks.commands.publish.snippets.snippets`:
onnxruntime's QNN EP for an encoder; onnxruntime-genai and, with ``bundle.runtimes: [genai,
genie]``, Genie for an LLM),
the versions that built and verified it (:func:`version_lines`) and how to check the files and
the signature (:func:`check_lines`).

Snippets are written for the text families (``encoder``, ``llm``); the vision and audio
families' cards say how to run them from their ``io.json`` (:mod:`.card`). Every snippet is a
fenced block (```python or ```sh) that runs as written in the bundle folder
(the one holding the card), on a Snapdragon device or on the x86_64 HTP simulator; the card's
test extracts and runs each one against a published bundle (tests/commands/test_cards.py).
The shell snippets read what only the user has (the publisher's key) from environment
variables named in the text.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path

from tasks.commands.publish.snippets import _onnx_io, snippets

#: what an input or output means, by name (regex, fullmatch); ``{S}``, ``{C}``, ``{V}`` filled in
MEANINGS = (
    # encoders (optimum's text encoder inputs; transformers' output names)
    (r"input_ids", "token ids from `tokenizer.json`, padded at the end to the graph's length"),
    (r"attention_mask", "1 for a real token, 0 for padding"),
    (r"token_type_ids", "segment ids: all 0 for one text"),
    (r"last_hidden_state", "each token's embedding (padding rows included: pool with attention_mask)"),
    (r"pooler_output", "the model's pooled output (its [CLS] head)"),
    # LLMs, onnxruntime-genai's pipeline layout (tasks/llm/genai.py)
    (r"past_seq_len", "tokens already in the KV cache (genai feeds it)"),
    (r"total_seq_len", "tokens in the KV cache after this call (genai feeds it)"),
    (
        r"past_(key|value)_\{l\}",
        "layer l's {kv} cache, all {C} slots; genai binds it and present_{0}_{{l}} to one buffer",
    ),
    (r"present_(key|value)_\{l\}", "layer l's {kv} cache after this call (the same buffer, updated in place)"),
    # LLMs, Genie's layout (tasks/llm/genie/graphs.py)
    (
        r"past_(key)_\{l\}_in",
        "layer l's {kv} cache before this call: the context's slots less this call's, keys transposed",
    ),
    (r"past_(value)_\{l\}_in", "layer l's {kv} cache before this call: the context's slots less this call's"),
    (r"past_(key|value)_\{l\}_out", "this call's new {kv} entries of layer l (Genie copies them into its cache)"),
    (r"position_ids_(cos|sin)", "{0} of the rotary angles of each position (Genie computes them)"),
    (r"hidden_states_\{l\}|hidden_states_\d+", "the hidden state one part hands the next"),
    (r"logits", "next-token scores of each position of the call"),
)
#: Genie's attention mask, which differs from an encoder's
_GENIE_MASK = "additive mask, this call's rows x all {C} slots: 0 attend, -1000 masked (quantized)"


def meaning(name: str, genie: bool = False, context: int | None = None) -> str:
    """What tensor ``name`` (layer numbers already folded to ``{l}`` by :func:`io_tables`) holds,
    one phrase from :data:`MEANINGS`; "" for a name none matches."""
    if genie and name == "attention_mask":
        return _GENIE_MASK.format(C=context)
    for pattern, text in MEANINGS:
        m = re.fullmatch(pattern, name)
        if m:
            kv = {"key": "K", "value": "V"}.get(m.group(1) if m.groups() else "", "")
            return text.format(m.group(1) if m.groups() else "", kv=kv, C=context)
    return ""


def _fold(rows: list[dict]) -> list[dict]:
    """Rows of one graph whose names differ only by a layer number (``past_key_3_in``) folded
    into one row (``past_key_{l}_in``, layers listed) when dtype and shape agree; a folded
    quantized row keeps each layer's scale."""
    out: list[dict] = []
    groups: dict[tuple, dict] = {}
    for r in rows:
        m = re.fullmatch(r"(.*_)(\d+)((?:_in|_out)?)", r["name"])
        if not m or not m.group(1).startswith(("past_", "present_")):
            out.append(dict(r, layers=None))
            continue
        key = (m.group(1) + "{l}" + m.group(3), r["dtype"], tuple(r["shape"]), r["zero_point"])
        if key not in groups:
            groups[key] = dict(r, name=key[0], layers=[], scales=[])
            out.append(groups[key])
        groups[key]["layers"].append(int(m.group(2)))
        groups[key]["scales"].append(r["scale"])
    return out


def _encoding(r: dict) -> str:
    if r.get("scale") is None and not any(s is not None for s in r.get("scales") or []):
        return ""
    if r.get("layers"):
        return f"zero point {r['zero_point']}; scale by layer " + ", ".join(
            f"{l}: {s:.6g}" for l, s in zip(r["layers"], r["scales"])
        )
    return f"scale {r['scale']:.6g}, zero point {r['zero_point']}"


def _table(title: str, rows: list[dict], genie: bool, context: int | None) -> list[str]:
    out = [
        "",
        title,
        "",
        "| tensor | | dtype | shape | meaning | quantized: value = (integer - zero point) x scale |",
        "|---|---|---|---|---|---|",
    ]
    for r in _fold(rows):
        name = f"`{r['name']}`" + (
            f" (layers {r['layers'][0]}-{r['layers'][-1]})"
            if r.get("layers") and len(r["layers"]) > 1
            else f" (layer {r['layers'][0]})"
            if r.get("layers")
            else ""
        )
        out.append(
            f"| {name} | {r['io']} | {r['dtype'].lower()} | {list(r['shape'])} | "
            f"{meaning(r['name'], genie, context)} | {_encoding(r)} |"
        )
    return out


def _binary_io(path: Path) -> dict[str, list[dict]]:
    """{graph name: rows} of a context binary, read back by libQnnSystem (scale and zero point
    from the binary itself: :class:`tasks.qnn.context_binary.Tensor`)."""
    from tasks.qnn import context_binary

    out = {}
    for g in context_binary.read(path).graphs:
        out[g.name.lstrip("_")] = [
            {
                "name": t.name,
                "io": io,
                "dtype": t.dtype,
                "shape": list(t.shape),
                "scale": t.scale,
                "zero_point": t.zero_point,
            }
            for io, ts in (("in", g.inputs), ("out", g.outputs))
            for t in ts
        ]
    return out


def layout(files: dict[str, Path]) -> dict:
    """What the bundle holds, from its shipped files ``files`` ({bundle path: file}), whatever
    family built it: {"kind": "parts" (an ``export.json`` and the runtime configs of a model in
    parts: genai, Genie) | "models" (``*_ctx.onnx`` EPContext models), "folders": [the runtime
    folders: "" or a target's], and per folder "models" (the ``*_ctx.onnx`` paths), "genai" (its
    config, parsed) and "genie" (its config, parsed), "export" (export.json, parsed)}."""
    folders: dict[str, dict] = {}
    for rel in files:
        d, base = posixpath.dirname(rel), posixpath.basename(rel)
        if base in ("genai_config.json", "genie_config.json", "export.json"):
            folders.setdefault(d, {})[base.split("_")[0].removesuffix(".json")] = json.loads(files[rel].read_text())
    parts = bool(folders)
    if not parts:
        for rel in files:
            if rel.endswith("_ctx.onnx"):
                folders.setdefault(posixpath.dirname(rel), {}).setdefault("models", []).append(rel)
    return {"kind": "parts" if parts else "models", "folders": dict(sorted(folders.items()))}


def io_tables(files: dict[str, Path], lay: dict) -> list[str]:
    """The card's "Inputs and outputs" section: per shipped graph (an encoder's EPContext model;
    an LLM's genai pipeline models and Genie binaries), every input and output: name, dtype,
    shape, meaning, and for a quantized one its scale and zero point (genai's models: the
    shipped ``export.json``, which the compile stage checked against the binaries; Genie's:
    the binaries read back). Tensors that differ only by layer share a row."""
    out = ["", "## Inputs and outputs", ""]
    if lay["kind"] == "models":
        out.append(
            "What onnxruntime feeds the EPContext model and gets back (its context binary's own inputs and "
            "outputs, read back, are the same)."
        )
        for f in lay["folders"].values():
            for rel in f["models"]:
                out += _table(f"`{rel}`", _onnx_io(files[rel]), False, None)
        return out
    out.append(
        "genai and Genie feed these themselves; they matter to a runtime of your own. S = tokens per call, "
        "C = context length; the KV cache crosses the boundary as integers."
    )
    for d, f in lay["folders"].items():
        desc, C = f.get("export") or {}, (f.get("export") or {}).get("context_len")
        declared = {}
        for p in desc.get("parts", []):
            for kind in ("prefill", "decode"):
                for t in p[kind]["inputs"] + p[kind]["outputs"]:
                    declared.setdefault(t["name"], t)
        if "genai" in f:
            for entry in f["genai"]["model"]["decoder"].get("pipeline", []):
                ((name, e),) = entry.items()
                rel = posixpath.join(d, e["filename"])
                out += _table(f"onnxruntime-genai: `{rel}` ({name})", _onnx_io(files[rel], declared), False, C)
        if "genie" in f:
            for b in f["genie"]["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
                rel = posixpath.normpath(posixpath.join(d, b))
                for g, rows in _binary_io(files[rel]).items():
                    out += _table(f"Genie: `{rel}`, graph `{g}`", rows, True, C)
    return out


def version_lines(tools: dict[str, str], lay: dict, binaries_sdk: list[str]) -> list[str]:
    """The card's "Runtime versions" section: the versions that built and verified the bundle
    (``tools``: {tool: version} merged from the stage entries' manifests), with the QNN SDK
    build the context binaries carry (``binaries_sdk``), and for Genie the API version of
    ``libGenie.so`` (:func:`tasks.qnn.libgenie.api_version`, read only when the installed
    onnxruntime-qnn is the one recorded). No older version was run: the card says so."""
    from tasks import tools as tool_versions
    from tasks.qnn import libgenie

    rows = [
        (
            "QNN SDK (compiled the context binaries)",
            f"{tools.get('qnn-sdk', '?')}" + (f" (binaries: {', '.join(binaries_sdk)})" if binaries_sdk else ""),
        ),
        ("onnxruntime", tools.get("onnxruntime", "?")),
        ("onnxruntime-qnn (the QNN EP; ships the QNN runtime libraries)", tools.get("onnxruntime-qnn", "?")),
    ]
    genie = any("genie" in f for f in lay["folders"].values())
    if lay["kind"] == "parts":
        rows.append(("onnxruntime-genai", tools.get("onnxruntime-genai", "?")))
    if genie:
        api = (
            libgenie.api_version() if tool_versions.version("onnxruntime-qnn") == tools.get("onnxruntime-qnn") else None
        )
        rows.append(
            (
                "Genie (libGenie.so of onnxruntime-qnn)",
                f"onnxruntime-qnn {tools.get('onnxruntime-qnn', '?')}" + (f", Genie API {api}" if api else ""),
            )
        )
    return [
        "",
        "## Runtime versions",
        "",
        "What built this bundle and ran it in verify, as pinned (`constraints.txt`). Only these were tested; "
        "which older runtimes load the binaries is not known here. A QNN runtime older than the SDK that "
        "compiled a context binary is not expected to load it.",
        "",
        "| runtime | version |",
        "|---|---|",
        *(f"| {a} | {b} |" for a, b in rows),
    ]


def check_lines() -> list[str]:
    """The card's "Check it" section: the files against ``manifest.json`` (npubuild's
    ``check_bundle``, folder or archive; or ``sha256sum``) and a signed bundle's signature
    with the stock OpenSSF ``model_signing`` CLI (its own ``verify key`` / ``verify
    certificate``, which ignore the signature file itself)."""
    from tasks import tools
    from tasks.commands.publish.signing import SIGNATURE

    return [
        "",
        "## Check it",
        "",
        "`manifest.json` lists every other file's sha256 and size; npubuild checks them with "
        "`doit check_bundle --path <this folder, or its .tar.gz>`, and the same files are in the archive.",
        "",
        f"A signed bundle holds `{SIGNATURE}`, an OpenSSF model-signing signature over every file here. Check it "
        f"with the stock CLI (`pip install model-signing=={tools.version('model-signing')}`), in this folder, "
        "with the publisher's public key (PEM) in `PUBLIC_KEY`:",
        "",
        "```sh",
        f'model_signing verify key . --signature {SIGNATURE} --public_key "$PUBLIC_KEY"',
        "```",
        "",
        "or, signed with a certificate, with the chain of its CA (PEM) in `CA_CHAIN`:",
        "",
        "```sh",
        f'model_signing verify certificate . --signature {SIGNATURE} --certificate_chain "$CA_CHAIN"',
        "```",
    ]


def usage_lines(recipe, files: dict[str, Path], tools: dict[str, str], binaries_sdk: list[str]) -> list[str]:
    """The sections this module adds to a card, in order: "Use it", inputs and outputs, runtime
    versions (:func:`check_lines` goes after the files list). ``files``: {bundle path: file} of
    what ships (publish's plan). A graph built from an ONNX file ships an ``io.json``: its snippet
    reads it (:func:`.snippets.io_snippet`) and the card's "How to run it" tables it
    (:mod:`.card`)."""
    lay = layout(files)
    if "io.json" in files:  # a graph built from an ONNX file: the snippet reads its io.json
        import json

        from tasks.commands.publish.snippets import io_snippet

        io = json.loads(files["io.json"].read_text(encoding="utf-8"))
        return io_snippet(io, recipe.compile.targets[0], tools) + version_lines(tools, lay, binaries_sdk)
    return snippets(recipe, files, lay, tools) + io_tables(files, lay) + version_lines(tools, lay, binaries_sdk)
