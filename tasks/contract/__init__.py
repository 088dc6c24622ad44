"""The stage implementations, found by kind and model family.

A stage kind (:data:`tasks.recipe.plan.KINDS`) has one implementation per model family (``export.family``:
``encoder`` or ``llm``), or one for every family: :data:`IMPLEMENTATIONS` names the module, whose
``STAGE`` (:class:`tasks.contract.stage.Stage`) declares everything the engine, the plan and the
recipe schema need: version, tools, the recipe params it reads, files, hooks, artifacts. The plan
picks the implementation once (``StageSpec.family``), so no stage branches on the family inside.
An LLM's stages each build one part (``params["part"]``); ``bundle`` and ``verify`` join the
parts (``tasks/recipe/plan.py``). ``common.py`` here is what several implementations share, ``params.py``
the recipe keys several families read, ``schema.py`` the recipe sections assembled from all of it.

A stage never imports doit and never writes into the cache itself.
"""

from importlib import import_module

#: stage kind -> {model family (None: every family): dotted module name holding ``STAGE``}
IMPLEMENTATIONS = {
    "download": {None: "tasks.sources.download"},
    "export": {"encoder": "tasks.encoder.export", "llm": "tasks.llm.export"},
    "patch": {None: "tasks.patches.stage"},
    "calibrate": {"llm": "tasks.llm.calibrate"},  # LLM parts: the fp32 part over the calibration schedule
    "quantize": {"encoder": "tasks.encoder.quantize", "llm": "tasks.llm.quantize"},
    "compile": {"encoder": "tasks.encoder.compile", "llm": "tasks.llm.compile"},
    "genie_quantize": {"llm": "tasks.llm.genie.quantize"},  # LLM parts in Genie's layout, QDQ (bundle.runtimes: genie)
    "genie_compile": {"llm": "tasks.llm.genie.compile"},  # ... their context binaries, named for Genie
    "bundle": {"llm": "tasks.llm.bundle"},  # LLM parts joined: export.json, genai_config.json, genie_config.json
    "verify": {"encoder": "tasks.encoder.verify", "llm": "tasks.llm.verify"},
}
#: the model families (``export.family``)
FAMILIES = ("encoder", "llm")


def _module_name(kind: str, family: str) -> str:
    if kind not in IMPLEMENTATIONS:
        raise KeyError(f"unknown stage kind {kind!r}; known: {', '.join(IMPLEMENTATIONS)}")
    impls = IMPLEMENTATIONS[kind]
    name = impls.get(None) or impls.get(family)
    if name is None:
        raise KeyError(f"no {family} implementation of stage kind {kind!r}; families: {', '.join(impls)}")
    return name


def implementation(kind: str, family: str = "encoder"):
    """The :class:`~tasks.contract.stage.Stage` of ``kind`` for models of ``family`` (its module
    imported; Python keeps it). Raises KeyError for an unknown kind or family."""
    return import_module(_module_name(kind, family)).STAGE


def implementations(kind: str | None = None) -> list:
    """Every implementation (of ``kind``), in :data:`IMPLEMENTATIONS` order."""
    kinds = [kind] if kind else list(IMPLEMENTATIONS)
    return [import_module(n).STAGE for k in kinds for n in IMPLEMENTATIONS[k].values()]


def _pick(data: dict, path: str):
    for k in path.split("."):
        if not isinstance(data, dict) or k not in data:
            return None, False
        data = data[k]
    return data, True


def params_from(section: dict, kind: str, family: str) -> dict:
    """The params of ``kind``'s ``family`` implementation from its recipe section (a plain dict,
    the validated section dumped): the keys it lists in ``params``, nested ones kept nested
    (``calibration.samples`` -> ``{"calibration": {"samples": ...}}``). Raises KeyError for an
    unknown kind or family."""
    out: dict = {}
    for p in implementation(kind, family).params:
        value, found = _pick(section, p.path)
        if found:
            *parents, leaf = p.path.split(".")
            d = out
            for k in parents:
                d = d.setdefault(k, {})
            d[leaf] = value
    return out


def files_from(section: dict, kind: str, family: str) -> dict[str, str]:
    """{role: project-relative path} of the files ``kind``'s ``family`` implementation reads,
    from its recipe section (its ``files``; keys set to null are left out)."""
    out = {}
    for p, role in implementation(kind, family).files.items():
        value, found = _pick(section, p.path)
        if found and value not in (None, ""):
            out[role] = value
    return out


def artifact_patterns(kind: str) -> tuple[str, ...]:
    """The fnmatch patterns of the files a user gets of stage ``kind`` (every family's
    implementation's ``artifacts``); () for a kind that gives none or is unknown."""
    if kind not in IMPLEMENTATIONS:
        return ()
    return tuple(dict.fromkeys(p for st in implementations(kind) for p in st.artifacts))
