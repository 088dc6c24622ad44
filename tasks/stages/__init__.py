"""The stage contract: the kinds, what an implementation provides, and the table of
implementations chosen once when a recipe is planned (:data:`IMPLEMENTATIONS`,
``StageSpec.family``), so no stage branches on the family inside. Each model family is a
folder of its implementations (``tasks/encoder/<kind>.py``; ``tasks/llm/``: ``export``,
``quant``, ``compile``, ``verify``); ``download`` and ``patch`` serve every family and live
here, as does ``common.py``, what several implementations share (it imports no family).
Each implementation module has

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

from functools import lru_cache
from importlib import import_module

# The outputs a user gets, per stage kind (fnmatch patterns on file names): linked into
# build/<recipe>/ and copied into published bundles.
ARTIFACTS = {
    "compile": ("*_ctx.onnx", "*.bin", "genai_config.json", "export.json", "*.npy"),
    "export": ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "config.json",
               "generation_config.json", "added_tokens.json"),
    "verify": ("verify.json",),
}

#: stage kind -> {model family (None: every family): dotted module name}
IMPLEMENTATIONS = {
    "download": {None: "tasks.stages.download"},
    "export": {"encoder": "tasks.encoder.export", "llm": "tasks.llm.export"},
    "patch": {None: "tasks.stages.patch"},
    "quantize": {"encoder": "tasks.encoder.quantize", "llm": "tasks.llm.quant"},
    "compile": {"encoder": "tasks.encoder.compile", "llm": "tasks.llm.compile"},
    "verify": {"encoder": "tasks.encoder.verify", "llm": "tasks.llm.verify"},
}
#: the model families (``export.family``)
FAMILIES = ("encoder", "llm")


@lru_cache(maxsize=None)
def module_for(kind: str, family: str = "encoder"):
    """The module implementing stage ``kind`` for models of ``family`` (``export.family`` of the
    recipe: ``encoder`` or ``llm``). Raises KeyError for an unknown kind or family."""
    if kind not in IMPLEMENTATIONS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(IMPLEMENTATIONS)}")
    impls = IMPLEMENTATIONS[kind]
    name = impls.get(None) or impls.get(family)
    if name is None:
        raise KeyError(f"no {family} implementation of stage kind {kind!r}; families: {', '.join(impls)}")
    return import_module(name)


def modules_of(kind: str) -> list:
    """Every implementation module of stage ``kind``."""
    return [import_module(n) for n in IMPLEMENTATIONS[kind].values()]
