"""The model families and their stage implementations, found by name.

A model family (``export.family``) is a folder of ``tasks/`` whose ``family.py`` declares it
(:class:`tasks.contract.model_family.Family`): its stage table (stage kind -> the module
implementing it), its plan (the DAG a recipe of it expands into) and its family-wide hooks.
:data:`FAMILIES` names each declaration's module, so the recipe schema, the plan and the engine
find a family by name and import none. An implementation module's ``STAGE``
(:class:`tasks.contract.stage.Stage`) declares everything the engine and the recipe schema need
of one stage: version, tools, the recipe params it reads, files, hooks, artifacts. The plan picks
the implementation once (``StageSpec.family``), so no stage branches on the family inside.
``common.py`` here is what several implementations share, ``params.py`` the recipe keys several
read, ``schema.py`` the recipe sections assembled from all of it.

A stage never imports doit and never writes into the cache itself.
"""

from importlib import import_module

#: model family (``export.family``) -> the module holding its ``FAMILY``; adding a family is
#: its folder and one line here (docs/layout.md)
FAMILIES = {
    "encoder": "tasks.encoder.family",
    "llm": "tasks.llm.family",
    "vision": "tasks.vision.family",
    "audio": "tasks.audio.family",
}
#: the family of a recipe that does not set ``export.family``
DEFAULT_FAMILY = "encoder"


def family(name: str):
    """The :class:`~tasks.contract.model_family.Family` named ``name`` (its module imported;
    Python keeps it). Raises KeyError for an unknown family, naming the known ones."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return import_module(FAMILIES[name]).FAMILY


def families() -> list:
    """Every registered :class:`~tasks.contract.model_family.Family`, in :data:`FAMILIES` order."""
    return [family(n) for n in FAMILIES]


def kinds() -> tuple[str, ...]:
    """Every stage kind some family has, in build order: the families' tables merged, each kind
    placed after the kind before it in the first table that has it (``calibrate`` after
    ``patch``, ``bundle`` before ``verify``)."""
    out: list[str] = []
    for fam in families():
        before = None
        for kind in fam.stages:
            if kind not in out:
                out.insert(out.index(before) + 1 if before is not None else 0, kind)
            before = kind
    return tuple(out)


def implementation(kind: str, family_name: str | None = None):
    """The :class:`~tasks.contract.stage.Stage` of ``kind`` for models of family ``family_name``
    (its module imported; Python keeps it); without a family, the one module every family that
    has ``kind`` names (the shared ``download`` and ``patch``). Raises KeyError for an unknown
    family, a kind the family has not, or a kind without one shared module."""
    if family_name is not None:
        return import_module(family(family_name).implementation_module(kind)).STAGE
    mods = implementation_modules(kind)
    if len(mods) != 1:
        raise KeyError(
            f"stage kind {kind!r} has {len(mods)} implementations ({', '.join(mods) or 'none'}): name the family"
        )
    return import_module(mods[0]).STAGE


def implementation_modules(kind: str | None = None) -> list[str]:
    """The dotted module names implementing ``kind`` (every kind: in :func:`kinds` order), each
    once, in :data:`FAMILIES` order."""
    fams = families()
    return list(dict.fromkeys(f.stages[k] for k in ([kind] if kind else kinds()) for f in fams if k in f.stages))


def implementations(kind: str | None = None) -> list:
    """Every implementation (of ``kind``): the ``STAGE`` of each of :func:`implementation_modules`."""
    return [import_module(n).STAGE for n in implementation_modules(kind)]


def readers_of(module: str) -> tuple[str, ...]:
    """The names of the families whose stage tables name implementation module ``module``."""
    return tuple(f.name for f in families() if module in f.stages.values())


def _pick(data: dict, path: str):
    for k in path.split("."):
        if not isinstance(data, dict) or k not in data:
            return None, False
        data = data[k]
    return data, True


def params_from(section: dict, kind: str, family_name: str) -> dict:
    """The params of ``kind``'s implementation for family ``family_name`` from its recipe section (a plain dict,
    the validated section dumped): the keys it lists in ``params``, nested ones kept nested
    (``calibration.samples`` -> ``{"calibration": {"samples": ...}}``). Raises KeyError for an
    unknown kind or family."""
    out: dict = {}
    for p in implementation(kind, family_name).params:
        value, found = _pick(section, p.path)
        if found:
            *parents, leaf = p.path.split(".")
            d = out
            for k in parents:
                d = d.setdefault(k, {})
            d[leaf] = value
    return out


def files_from(section: dict, kind: str, family_name: str) -> dict[str, str]:
    """{role: project-relative path} of the files ``kind``'s implementation for family
    ``family_name`` reads,
    from its recipe section (its ``files``; keys set to null are left out)."""
    out = {}
    for p, role in implementation(kind, family_name).files.items():
        value, found = _pick(section, p.path)
        if found and value not in (None, ""):
            out[role] = value
    return out


def artifact_patterns(kind: str) -> tuple[str, ...]:
    """The fnmatch patterns of the files a user gets of stage ``kind`` (every family's
    implementation's ``artifacts``); () for a kind that gives none or is unknown."""
    if kind not in kinds():
        return ()
    return tuple(dict.fromkeys(p for st in implementations(kind) for p in st.artifacts))
