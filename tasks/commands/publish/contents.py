"""What a bundle ships, the one rule (:func:`shipped_files`): of the build's artifacts, the files
its runtimes load (named by ``genai_config.json``, ``genie_config.json``, an EPContext model, the
family's own rule) and what the bundle needs beside them (tokenizer, metadata), each
with who loads it, for the model card's "Files" table (:mod:`.card`); publish adds
:data:`WRITTEN`."""

from __future__ import annotations

from pathlib import Path

from tasks.commands.publish.errors import PublishError

GENAI, GENIE, QNN_EP = "onnxruntime-genai", "Genie", "onnxruntime QNN EP"
_TOKENIZER_NAMES = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json")
_METADATA = {
    "config.json": "metadata: the source model's configuration (transformers)",
    "generation_config.json": "metadata: the source model's generation defaults (transformers)",
    "verify.json": "metadata: npubuild's verify report (metrics, every binary read back)",
    "io.json": "metadata: the graph's inputs and outputs, and the preprocessing or stream and decoding a "
    'caller needs (the model card\'s "How to run it")',
    "metadata.json": "metadata: the source graph's metadata_props, kept aside at export (PP-OCR rec: the "
    "character list its output indexes)",
}
#: what publish writes beside the artifacts, and who reads it (the card lists them too)
WRITTEN = {
    "README.md": "people and the Hugging Face Hub: this model card",
    "manifest.json": "`doit check_bundle`: sha256 and size of every other file, how it was built",
}


def _ep_binaries(ctx_path: Path, rel: str) -> list[str]:
    """Bundle paths of the context binaries the EPContext model ``ctx_path`` (bundle path
    ``rel``) names (``ep_cache_context``, relative to the model; embedded ones have none)."""
    import posixpath

    from tasks.qnn.ep import ep_context_info

    refs = {n.get("ep_cache_context") for n in ep_context_info(ctx_path) if int(n.get("embed_mode", 0)) == 0}
    return sorted(posixpath.normpath(posixpath.join(posixpath.dirname(rel), r)) for r in refs if r)


def shipped_files(sources: dict[str, Path], family=None) -> dict[str, list[str]]:
    """The one rule of what a bundle ships, over the build's artifacts ``sources`` ({bundle
    path: file}, :func:`.bundle.bundle_sources`) of a recipe of ``family`` (its
    :class:`tasks.contract.model_family.Family`; None: no family rule): {bundle path: who loads
    it, one phrase each} of the files that ship; an artifact left out stays in
    ``build/<recipe>/`` only. A bundle ships only what its runtimes load. In each folder of the
    bundle (its top, or ``<target>/`` with several targets), a file ships when

    - a runtime config names it, paths relative to the config's folder: ``genai_config.json``
      (onnxruntime-genai: the config, each pipeline model's ``filename`` and the context
      binaries those EPContext models name in ``ep_cache_context``), ``genie_config.json``
      (Genie: the config, every ``ctx-bins`` entry, ``tokenizer.path``, ``backend.extensions``);
    - the family's own rule (``Family.shipped``) names it: files its own runner or decoding
      loads that no runtime config names (LLMs: ``export.json``, its ``embed_file``, and in a
      folder without ``genai_config.json`` the graphs LLMRunner loads), an EPContext model with
      the binaries it names; the folders that rule claims are its to decide;
    - the folder is neither a runtime config's nor claimed (an encoder's): every EPContext model
      (``*_ctx.onnx``, what onnxruntime's QNN EP loads) and the binaries it names;
    - it is a tokenizer file (og.Tokenizer, transformers), or metadata (``config.json``,
      ``generation_config.json``, ``verify.json``).

    Publish adds :data:`WRITTEN` (the card, the manifest) and, signed, ``npubuild.sig``. So the
    per-graph binaries an LLM compiles beside its weight-shared ones (``part{k}/``,
    ``genie/part{k}/``: the x86_64 HTP simulator crashes loading a two-graph binary, so verify
    runs those) ship only where a runtime config names them (``weight_sharing: false``).
    Raises PublishError when a runtime config names a file the build does not have."""
    import json
    import posixpath
    from fnmatch import fnmatch

    out: dict[str, list[str]] = {}
    claimed, own = family.shipped(sources) if family is not None and family.shipped else ((), ())

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

    # the folders a runtime config or the family's own rule decides: no other rule ships a model there
    folders = sorted(
        {posixpath.dirname(r) for r in sources if posixpath.basename(r) in ("genai_config.json", "genie_config.json")}
        | set(claimed)
    )
    for d in folders:

        def at(f: str, d: str = d) -> str:
            return posixpath.join(d, f)

        if at("genai_config.json") in sources:
            cfg = json.loads(sources[at("genai_config.json")].read_text())
            dec = cfg["model"]["decoder"]
            files = [next(iter(e.values()))["filename"] for e in dec.get("pipeline", [])] + (
                [dec["filename"]] if dec.get("filename") else []
            )
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
    for rel, who, by, runtime in own:
        if runtime is None:
            name(rel, who, by)
        else:
            models(posixpath.dirname(rel), [posixpath.basename(rel)], runtime, by)
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
