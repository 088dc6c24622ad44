"""What a bundle ships, the one rule (:func:`shipped_files`): of the build's artifacts, the files
its runtimes load (named by ``genai_config.json``, ``genie_config.json``, an encoder's EPContext
model) and what the bundle needs beside them (export description, tokenizer, metadata), each
with who loads it, for the model card's "Files" table (:mod:`.card`); publish adds
:data:`WRITTEN`."""

from __future__ import annotations

from pathlib import Path

from tasks.commands.publish.errors import PublishError

GENAI, GENIE, QNN_EP, RUNNER = "onnxruntime-genai", "Genie", "onnxruntime QNN EP", "npubuild LLMRunner"
_TOKENIZER_NAMES = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json")
_METADATA = {"config.json": "metadata: the source model's configuration (transformers)",
             "generation_config.json": "metadata: the source model's generation defaults (transformers)",
             "verify.json": "metadata: npubuild's verify report (metrics, every binary read back)",
             "io.json": "metadata: the graph's inputs and outputs, and the preprocessing or stream and decoding a "
                        "caller needs (the model card's \"How to run it\")",
             "metadata.json": "metadata: the source graph's metadata_props, kept aside at export (PP-OCR rec: the "
                              "character list its output indexes)"}
#: what publish writes beside the artifacts, and who reads it (the card lists them too)
WRITTEN = {"README.md": "people and the Hugging Face Hub: this model card",
           "manifest.json": "`doit check_bundle`: sha256 and size of every other file, how it was built"}


def _ep_binaries(ctx_path: Path, rel: str) -> list[str]:
    """Bundle paths of the context binaries the EPContext model ``ctx_path`` (bundle path
    ``rel``) names (``ep_cache_context``, relative to the model; embedded ones have none)."""
    import posixpath

    from tasks.qnn.ep import ep_context_info

    refs = {n.get("ep_cache_context") for n in ep_context_info(ctx_path) if int(n.get("embed_mode", 0)) == 0}
    return sorted(posixpath.normpath(posixpath.join(posixpath.dirname(rel), r)) for r in refs if r)


def shipped_files(sources: dict[str, Path]) -> dict[str, list[str]]:
    """The one rule of what a bundle ships, over the build's artifacts ``sources`` ({bundle
    path: file}, :func:`.bundle.bundle_sources`): {bundle path: who loads it, one phrase each} of the
    files that ship; an artifact left out stays in ``build/<recipe>/`` only. Issue 48, item 6:
    a bundle ships only what its runtimes load. In each folder of the bundle (its top, or
    ``<target>/`` with several targets), a file ships when

    - a runtime config names it, paths relative to the config's folder: ``genai_config.json``
      (onnxruntime-genai: the config, each pipeline model's ``filename`` and the context
      binaries those EPContext models name in ``ep_cache_context``), ``genie_config.json``
      (Genie: the config, every ``ctx-bins`` entry, ``tokenizer.path``, ``backend.extensions``);
    - the folder has no runtime config and an LLM's ``export.json`` (``embedding: host``: genai
      cannot feed it): the graphs npubuild's LLMRunner loads, as genai would name them
      (:func:`tasks.llm.genai.bundle_files`, weight-shared when compiled so), and their binaries;
    - the folder holds neither (an encoder): every EPContext model (``*_ctx.onnx``, what
      onnxruntime's QNN EP loads) and the binaries it names;
    - it is an LLM's ``export.json`` (every graph's I/O, for LLMRunner and the catalog) or the
      host-side embedding table it names (``embed_file``), a tokenizer file (og.Tokenizer,
      transformers), or metadata (``config.json``, ``generation_config.json``, ``verify.json``).

    Publish adds :data:`WRITTEN` (the card, the manifest) and, signed, ``npubuild.sig``. So the
    per-graph binaries an LLM compiles beside its weight-shared ones (``part{k}/``,
    ``genie/part{k}/``: the x86_64 HTP simulator crashes loading a two-graph binary, so verify
    runs those) ship only where a runtime config names them (``weight_sharing: false``).
    Raises PublishError when a runtime config names a file the build does not have."""
    import json
    import posixpath
    from fnmatch import fnmatch

    out: dict[str, list[str]] = {}

    def name(rel: str, who: str, by: str) -> None:
        if rel not in sources:
            raise PublishError(f"refusing to publish: {by} names {rel}, which the build does not have")
        if who not in out.setdefault(rel, []):
            out[rel].append(who)

    def models(folder: str, files: list[str], runtime: str, by: str) -> None:
        for f in files:
            rel = posixpath.normpath(posixpath.join(folder, f))
            name(rel, f"{runtime} ({by})", by)
            for b in _ep_binaries(sources[rel], rel):
                name(b, f"{runtime} (context binary of an EPContext model)", rel)

    # the LLM folders: where a runtime config or an LLM's export.json is
    folders = sorted({posixpath.dirname(r) for r in sources
                      if posixpath.basename(r) in ("genai_config.json", "genie_config.json", "export.json")})
    for d in folders:
        def at(f: str, d: str = d) -> str:
            return posixpath.join(d, f)
        if at("genai_config.json") in sources:
            cfg = json.loads(sources[at("genai_config.json")].read_text())
            dec = cfg["model"]["decoder"]
            files = [next(iter(e.values()))["filename"] for e in dec.get("pipeline", [])] + \
                ([dec["filename"]] if dec.get("filename") else [])
            name(at("genai_config.json"), f"{GENAI} (its config)", "genai_config.json")
            models(d, files, GENAI, at("genai_config.json"))
        if at("genie_config.json") in sources:
            dlg = json.loads(sources[at("genie_config.json")].read_text())["dialog"]
            eng, by = dlg["engine"], at("genie_config.json")
            name(by, f"{GENIE} (its config)", by)
            for f in eng["model"]["binary"]["ctx-bins"]:
                name(posixpath.normpath(at(f)), f"{GENIE} ({by} ctx-bins)", by)
            name(posixpath.normpath(at(dlg["tokenizer"]["path"])), f"{GENIE} ({by} tokenizer)", by)
            name(posixpath.normpath(at(eng["backend"]["extensions"])), f"{GENIE} ({by} extensions)", by)
        if at("export.json") in sources:
            desc = json.loads(sources[at("export.json")].read_text())
            name(at("export.json"), f"{RUNNER} and the catalog (every graph's inputs and outputs)", "the bundle")
            if desc.get("embed_file"):
                name(at(desc["embed_file"]), f"{RUNNER} (export.json embed_file: the host-side embedding table)",
                     at("export.json"))
            if at("genai_config.json") not in sources:
                from tasks.llm.genai import bundle_files

                shared = any(r.startswith(at("shared/")) for r in sources)
                models(d, list(bundle_files(desc, "shared" if shared else "").values()), RUNNER, at("export.json"))
    for rel in sources:
        base = posixpath.basename(rel)
        if base.endswith("_ctx.onnx") and not any(f == "" or rel.startswith(f + "/") for f in folders):
            models(posixpath.dirname(rel), [base], QNN_EP, "the EPContext model")  # an encoder's
        elif any(fnmatch(base, p) for p in _TOKENIZER_NAMES):
            genai = posixpath.join(posixpath.dirname(rel), "genai_config.json") in sources
            name(
                rel,
                "tokenizer: " + ("og.Tokenizer (onnxruntime-genai), " if genai else "") + "transformers",
                "the bundle",
            )
        elif base in _METADATA:
            name(rel, _METADATA[base], "the bundle")
    return dict(sorted(out.items()))
