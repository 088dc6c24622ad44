"""Issue 24: one table per concept. The precision names live in ``tasks/precisions.py`` and the
targets (names, soc_model / htp_arch numbers, the default) in ``tasks/targets.py``; no other
module of the package writes them in code (docstrings and comments may name them)."""
import ast

from conftest import REPO
from test_keys import import_cycles, package_modules

from tasks.precisions import NAMES
from tasks.targets import DEFAULT_TARGET, TARGETS


def direct_imports(name: str) -> frozenset[str]:
    """:func:`tasks.core.keys.direct_imports` of ``name`` (a session of its own)."""
    from tasks.core.keys import direct_imports
    from tasks.core.session import Session

    return direct_imports(Session(), name)


def _code_constants(f):
    """(line, value) of every constant in ``f``'s code, docstrings left out."""
    tree = ast.parse(f.read_text(encoding="utf-8"))
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]


def _modules(*skip):
    return [f for f in sorted((REPO / "tasks").rglob("*.py")) if f.relative_to(REPO / "tasks").as_posix() not in skip]


def test_precision_names_are_written_once():
    found = [(f.relative_to(REPO).as_posix(), line, v) for f in _modules("precisions.py")
             for line, v in _code_constants(f) if isinstance(v, str) and v in NAMES]
    assert found == [], found
    assert NAMES == ("w8a16", "w4a16", "w8a8")


def test_target_names_and_numbers_are_written_once():
    names = set(TARGETS) | {DEFAULT_TARGET}
    found = []
    for f in _modules("targets.py"):
        consts = _code_constants(f)
        found += [(f.relative_to(REPO).as_posix(), line, v) for line, v in consts if isinstance(v, str) and v in names]
        # the target travels by name: no function takes soc_model / htp_arch numbers (the LLM
        # helpers did, with defaults 60 / 73 written four times)
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg in ("soc_model", "htp_arch"):
                found.append((f.relative_to(REPO).as_posix(), node.lineno, node.arg))
    assert found == [], found


def test_the_longest_import_chain_inside_the_package_is_at_most_10_modules():
    """Issue 24: 12 modules deep before (dodo_tasks -> publish -> catalog -> buildstate -> engine
    -> plan -> recipe -> plancache -> cache -> remote -> digest -> paths); process plumbing
    moved to ``tasks/proc/`` and encoder input facts to ``tasks/encoder/inputs.py``."""
    from functools import lru_cache

    mods = package_modules()
    graph = {m: sorted(d for d in direct_imports(m) if d in mods and d != m) for m in mods}

    @lru_cache(maxsize=None)
    def chain(m):
        return max(([m] + chain(d) for d in graph[m]), key=len, default=[m])

    longest = max((chain(m) for m in mods), key=len)
    assert sum(map(len, graph.values())) > 60  # the graph was really read
    assert len(longest) <= 10, " -> ".join(longest)


def test_process_plumbing_imports_nothing_of_the_engine_or_the_families():
    for f in sorted((REPO / "tasks" / "proc").glob("*.py")):
        name = "tasks.proc." + f.stem if f.stem != "__init__" else "tasks.proc"
        assert all(d.startswith("tasks.proc") for d in direct_imports(name)), (name, direct_imports(name))


def test_no_family_imports_the_other_familys_code_and_stages_imports_no_family():
    """Issue 24: the encoder family (``tasks/encoder/``) and the LLM family (``tasks/llm/``)
    import nothing of each other, and the stage contract (``tasks/stages/``) imports neither."""

    def mods(folder):
        return ["tasks." + folder + ("" if f.stem == "__init__" else "." + f.stem)
                for f in sorted((REPO / "tasks" / folder).glob("*.py"))]

    for folder, banned in (("encoder", ("tasks.llm",)), ("llm", ("tasks.encoder",)),
                           ("stages", ("tasks.llm", "tasks.encoder"))):
        for m in mods(folder):
            bad = sorted(d for d in direct_imports(m) if d.startswith(banned))
            assert bad == [], (m, bad)


def test_each_stages_params_are_exactly_what_its_implementation_declares(monkeypatch):
    """Issue 24: the plan only wires; a stage's params are the recipe keys its family's
    implementation declares (``PARAMS``; nested ones nested), plus what the plan wires in
    (``target`` for compile and verify, ``task`` for verify; an LLM part stage's ``part``, an
    LLM part compile's ``per_graph``, the bundle's ``target`` and ``parts``), its files what ``FILES`` names."""
    monkeypatch.setenv("NPUBUILD_ROOT", str(REPO))
    from tasks.plan import expand
    from tasks.recipe import load_recipe
    from tasks.stages import module_for

    wired = {"compile": {"target"}, "verify": {"target", "task"}, "bundle": {"target", "parts"}}
    for name in ("minilm-l6-w4a16", "tiny-qwen2-w4a16"):
        for spec in expand(load_recipe(REPO / "recipes" / f"{name}.yaml")):
            if spec.kind in ("download", "patch"):
                continue
            mod = module_for(spec.kind, spec.family)
            top = {p.split(".")[0] for p in mod.PARAMS}
            part = set() if spec.part is None else {"part", "per_graph"} if spec.kind == "compile" else {"part"}
            assert set(spec.params) == top | wired.get(spec.kind, set()) | part, (name, spec.kind, sorted(spec.params))
            for p in mod.PARAMS:
                if "." in p:
                    outer, inner = p.split(".")
                    assert inner in spec.params[outer], (name, spec.kind, p)
            assert set(spec.files) == set(getattr(mod, "FILES", {}).values()) - ({"perplexity_text"} - set(spec.files))


def test_no_import_cycles_between_subfolders():
    """Issue 24: with each subfolder of ``tasks/`` (encoder, llm, stages, proc, patches, core) drawn as
    one node beside the top-level modules, the import graph has no cycle."""

    def node(m):
        parts = m.split(".")
        return parts[1] if (REPO / "tasks" / parts[1]).is_dir() else m

    mods = package_modules()
    graph: dict[str, set] = {}
    for m in mods:
        graph.setdefault(node(m), set()).update(node(d) for d in direct_imports(m) if d in mods and node(d) != node(m))
    cycles = import_cycles(graph)
    assert {"encoder", "llm", "stages", "proc", "patches", "core"} <= set(graph)
    assert cycles == [], cycles


def test_declared_params_read_from_source_equal_the_modules_own():
    """``tasks.stages.declared`` reads ``PARAMS`` / ``FILES`` with ast (the recipe loader does not
    import stage code); what it reads is what the imported module holds."""
    from tasks.stages import FAMILIES, IMPLEMENTATIONS, declared, module_for

    for kind, impls in IMPLEMENTATIONS.items():
        if None in impls:
            continue
        for family in FAMILIES:
            if family not in impls:  # calibrate and bundle: LLM parts only
                continue
            mod = module_for(kind, family)
            assert declared(kind, family) == (tuple(mod.PARAMS), dict(getattr(mod, "FILES", {}))), (kind, family)
            assert mod.PARAMS, (kind, family)


def test_core_modules_are_short_and_keep_no_state():
    """``tasks/core/``: each module under 300 lines, and none keeps state of its own (what a
    command remembers is in its ``tasks.core.session.Session``): no ``lru_cache``/``cache``
    decorator, no module-level assignment of a mutable value (a dict, list or set display or
    call, a comprehension) and no ``global`` statement."""
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    found = []
    for f in sorted((REPO / "tasks" / "core").glob("*.py")):
        text = f.read_text(encoding="utf-8")
        rel = f.relative_to(REPO).as_posix()
        if len(text.splitlines()) >= 300:
            found.append((rel, "lines", len(text.splitlines())))
        tree = ast.parse(text)
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, mutable) or (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                                              and value.func.id in ("dict", "list", "set", "defaultdict")):
                found.append((rel, node.lineno, "module-level mutable"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                found.append((rel, node.lineno, "global"))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for d in node.decorator_list:
                    name = ast.unparse(d.func if isinstance(d, ast.Call) else d)
                    if name.split(".")[-1] in ("lru_cache", "cache"):
                        found.append((rel, node.lineno, name))
    assert found == [], found
