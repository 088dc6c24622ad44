"""The stage contract: the kinds, what an implementation provides, and the table of
implementations chosen once when a recipe is planned (:data:`IMPLEMENTATIONS`,
``StageSpec.family``), so no stage branches on the family inside. Each model family is a
folder of its implementations (``tasks/encoder/<kind>.py``; ``tasks/llm/``: ``export``,
``calibrate``, ``quant``, ``compile``, ``bundle``, ``verify``, and for ``bundle.runtimes: genie``
``genie_quant``, ``genie_compile``: an LLM's stages each build one part, ``params["part"]``,
and ``bundle`` and ``verify`` join the parts: ``tasks/plan.py``); ``download`` (``tasks/sources/download.py``) and
``patch`` (``tasks/patches/stage.py``) serve every family. ``common.py`` here is what several
implementations share (it imports no family).
Each implementation module has

- ``VERSION: int``  bumped on any change of behaviour (enters the stage key);
- ``TOOLS: tuple[str, ...]``  tools whose versions enter the key (see ``tasks/tools.py``);
- ``PARAMS: tuple[str, ...]``  the recipe keys of its section it reads (dotted below a
  nested section: ``calibration.samples``): its params, the stage key's ``params``
  (:func:`params_from`); ``FILES: dict[str, str]`` recipe keys that name project files -> their
  role. A key that only the other family's implementation declares is a recipe load error
  (:func:`readers`); ``download`` and ``patch`` take their whole section;
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
    "genie_compile": ("*.bin",),
    "bundle": ("export.json", "genai_config.json", "*.npy", "genie_config.json", "htp_backend_ext_config.json"),
    "verify": ("verify.json",),
}

#: stage kind -> {model family (None: every family): dotted module name}
IMPLEMENTATIONS = {
    "download": {None: "tasks.sources.download"},
    "export": {"encoder": "tasks.encoder.export", "llm": "tasks.llm.export"},
    "patch": {None: "tasks.patches.stage"},
    "calibrate": {"llm": "tasks.llm.calibrate"},  # LLM parts: the fp32 part over the calibration schedule
    "quantize": {"encoder": "tasks.encoder.quantize", "llm": "tasks.llm.quant"},
    "compile": {"encoder": "tasks.encoder.compile", "llm": "tasks.llm.compile"},
    "genie_quantize": {"llm": "tasks.llm.genie_quant"},  # LLM parts in Genie's layout, QDQ (bundle.runtimes: genie)
    "genie_compile": {"llm": "tasks.llm.genie_compile"},  # ... their context binaries, named for Genie
    "bundle": {"llm": "tasks.llm.bundle"},  # LLM parts joined: export.json, genai_config.json, genie_config.json
    "verify": {"encoder": "tasks.encoder.verify", "llm": "tasks.llm.verify"},
}
#: the model families (``export.family``)
FAMILIES = ("encoder", "llm")


@lru_cache(maxsize=None)
def module_for(kind: str, family: str = "encoder"):
    """The module implementing stage ``kind`` for models of ``family`` (``export.family`` of the
    recipe: ``encoder`` or ``llm``). Raises KeyError for an unknown kind or family."""
    return import_module(_module_name(kind, family))


def _module_name(kind: str, family: str) -> str:
    if kind not in IMPLEMENTATIONS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(IMPLEMENTATIONS)}")
    impls = IMPLEMENTATIONS[kind]
    name = impls.get(None) or impls.get(family)
    if name is None:
        raise KeyError(f"no {family} implementation of stage kind {kind!r}; families: {', '.join(impls)}")
    return name


def modules_of(kind: str) -> list:
    """Every implementation module of stage ``kind``."""
    return [import_module(n) for n in IMPLEMENTATIONS[kind].values()]


#: recipe section -> the stage kind whose implementations declare its keys
SECTIONS = {"export": "export", "quantize": "quantize", "compile": "compile", "verify": "verify"}
#: recipe section -> every stage kind whose implementations read keys of it (an LLM's
#: ``quantize.calibration`` is read by its ``calibrate`` stages)
SECTION_KINDS = {"quantize": ("quantize", "calibrate", "genie_quantize"),
                 "compile": ("compile", "bundle", "genie_compile")}


def _pick(data: dict, path: str):
    for k in path.split("."):
        if not isinstance(data, dict) or k not in data:
            return None, False
        data = data[k]
    return data, True


@lru_cache(maxsize=None)
def declared(kind: str, family: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """``(PARAMS, FILES)`` of ``kind``'s ``family`` implementation, read from its source with
    ``ast`` (literals only), not imported: the recipe loader asks before any stage runs, and an
    encoder recipe's load need not import the LLM stages. Raises KeyError for an unknown kind
    or family, ValueError when the module writes them as anything but literals."""
    import ast
    import importlib.util
    from pathlib import Path

    name = _module_name(kind, family)
    tree = ast.parse(Path(importlib.util.find_spec(name).origin).read_text(encoding="utf-8"))
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("PARAMS", "FILES"):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                raise ValueError(f"{name}: expected {node.targets[0].id} as a literal (line {node.lineno})") from None
    return tuple(found.get("PARAMS", ())), dict(found.get("FILES", {}))


def params_from(section: dict, kind: str, family: str) -> dict:
    """The params of ``kind``'s ``family`` implementation from its recipe section (a plain dict,
    the validated section dumped): the keys it declares in ``PARAMS``, nested ones kept nested
    (``calibration.samples`` -> ``{"calibration": {"samples": ...}}``). Raises KeyError for an
    unknown kind or family."""
    out: dict = {}
    for path in declared(kind, family)[0]:
        value, found = _pick(section, path)
        if found:
            *parents, leaf = path.split(".")
            d = out
            for k in parents:
                d = d.setdefault(k, {})
            d[leaf] = value
    return out


def files_from(section: dict, kind: str, family: str) -> dict[str, str]:
    """{role: project-relative path} of the files ``kind``'s ``family`` implementation reads,
    from its recipe section (its ``FILES`` declaration; keys set to null are left out)."""
    out = {}
    for path, role in declared(kind, family)[1].items():
        value, found = _pick(section, path)
        if found and value not in (None, ""):
            out[role] = value
    return out


def readers(section: str, path: str) -> set[str]:
    """The families whose implementation of ``section``'s stage kind declares recipe key
    ``path`` (in ``PARAMS`` or ``FILES``): empty for a key the plan wires itself
    (``export.family``, ``compile.targets``)."""
    out = set()
    for kind in SECTION_KINDS.get(section, (SECTIONS[section],)):
        for family in FAMILIES:
            if family not in IMPLEMENTATIONS[kind]:
                continue
            params, files = declared(kind, family)
            keys = set(params) | set(files)
            if path in keys or any(k.startswith(path + ".") for k in keys):
                out.add(family)
    return out
