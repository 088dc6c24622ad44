"""Stage kinds: one module per kind, each a plain module with

- ``VERSION: int``  bumped on any change of behaviour (enters the stage key);
- ``TOOLS: tuple[str, ...]``  tools whose versions enter the key (see ``tasks/tools.py``);
- ``run(inputs: dict[str, Path], files: dict[str, Path], params: dict, out: Path) -> dict``
  reads upstream outputs (``inputs``, by role) and project files, writes its outputs into
  ``out`` and returns extra manifest info (JSON-able);
- optional ``key_extra(params) -> dict``, ``check(out, manifest, params) -> list[str]``,
  ``KEY_EXCLUDE`` and ``CODE_DEPS`` (modules the stage reaches by name, e.g. through the patch
  registry; what it imports is found from its source: ``tasks.engine.code_modules``).

A stage never imports doit and never writes into the cache itself.
"""

from importlib import import_module

# The outputs a user gets, per stage kind (fnmatch patterns on file names): linked into
# build/<recipe>/ and copied into published bundles.
ARTIFACTS = {
    "compile": ("*_ctx.onnx", "*.bin", "genai_config.json", "export.json", "*.npy"),
    "export": ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "config.json",
               "generation_config.json", "added_tokens.json"),
    "verify": ("verify.json",),
}

KIND_MODULES = {k: k for k in ("download", "export", "patch", "quantize", "compile", "verify")}


def module_for(kind: str):
    """The module implementing stage ``kind``. Raises KeyError for an unknown kind."""
    if kind not in KIND_MODULES:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(KIND_MODULES)}")
    return import_module(f"{__name__}.{KIND_MODULES[kind]}")
