"""Issue 24: one table per concept. The precision names live in ``tasks/qnn/precisions.py`` and the
targets (names, soc_model / htp_arch numbers, the default) in ``tasks/qnn/targets.py``; no other
module of the package writes them in code (docstrings and comments may name them)."""

import ast
from pathlib import Path

from conftest import REPO
from code_graph import import_cycles, package_modules

from tasks.qnn.precisions import NAMES
from tasks.qnn.targets import DEFAULT_TARGET, TARGETS
import functools


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
    found = [
        (f.relative_to(REPO).as_posix(), line, v)
        for f in _modules("qnn/precisions.py")
        for line, v in _code_constants(f)
        if isinstance(v, str) and v in NAMES
    ]
    assert found == [], found
    assert NAMES == ("w8a16", "w4a16", "w8a8")


def test_target_names_and_numbers_are_written_once():
    names = set(TARGETS) | {DEFAULT_TARGET}
    found = []
    for f in _modules("qnn/targets.py"):
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

    mods = package_modules()
    graph = {m: sorted(d for d in direct_imports(m) if d in mods and d != m) for m in mods}

    @functools.cache
    def chain(m):
        return max(([m] + chain(d) for d in graph[m]), key=len, default=[m])

    longest = max((chain(m) for m in mods), key=len)
    assert sum(map(len, graph.values())) > 60  # the graph was really read
    assert len(longest) <= 10, " -> ".join(longest)


def test_process_plumbing_imports_nothing_of_the_engine_or_the_families():
    """``tasks/proc/`` (processes, RSS, the memory budget) imports only itself and the package's
    errors (it imports nothing of the package)."""
    for f in sorted((REPO / "tasks" / "proc").glob("*.py")):
        name = "tasks.proc." + f.stem if f.stem != "__init__" else "tasks.proc"
        bad = [d for d in direct_imports(name) if not d.startswith("tasks.proc") and d != "tasks.errors"]
        assert bad == [], (name, bad)


def _family_folders() -> set[str]:
    """The folders of ``tasks/`` that are a registered family's (``tasks.<folder>.family``)."""
    from tasks.contract import FAMILIES

    return {m.split(".")[1] for m in FAMILIES.values()}


def test_no_family_imports_the_other_familys_code_and_stages_imports_no_family():
    """Issue 24: no family's folder (``tasks/encoder/``, ``tasks/llm/``, any registered one)
    imports another's, and the stage contract (``tasks/contract/``) imports none."""

    def mods(folder):
        return [
            "tasks." + folder + ("" if f.stem == "__init__" else "." + f.stem)
            for f in sorted((REPO / "tasks" / folder).glob("*.py"))
        ]

    folders = _family_folders()
    assert {"encoder", "llm"} <= folders
    for folder in sorted(folders | {"contract"}):
        others = folders - {folder}
        for m in mods(folder):
            bad = sorted(d for d in direct_imports(m) if set(d.split(".")[1:2]) & others)
            assert bad == [], (m, bad)


def test_the_recipe_the_plan_and_the_engine_import_no_family():
    """The recipe format, the plan and the engine know the families only through the registry
    (``tasks.contract.family``, by name) and the ``Family`` and ``Stage`` declarations: no module
    of them imports a family's folder, at any level of a function."""
    folders = _family_folders()
    mods = [
        "tasks.recipe.load",
        "tasks.recipe.yaml_files",
        "tasks.recipe.checks",
        "tasks.recipe.plan",
        *("tasks.core." + f.stem for f in sorted((REPO / "tasks" / "core").glob("*.py")) if f.stem != "__init__"),
    ]
    bad = {m: sorted(d for d in direct_imports(m) if set(d.split(".")[1:2]) & folders) for m in mods}
    assert {m: b for m, b in bad.items() if b} == {}
    assert len(mods) >= 14


def test_the_engine_imports_no_qnn_module():
    """The engine (``tasks/core/``) knows the QNN domain through the stages' hooks and the error
    bases only: none of its modules imports ``tasks.qnn``, at any level of a function."""
    mods = ["tasks.core." + f.stem for f in sorted((REPO / "tasks" / "core").glob("*.py")) if f.stem != "__init__"]
    bad = {m: sorted(d for d in direct_imports(m) if d.startswith("tasks.qnn")) for m in mods}
    assert {m: b for m, b in bad.items() if b} == {}
    assert len(mods) >= 10


def _names_a_family(tree, names: set, folders: set) -> list[tuple[int, str]]:
    """(line, what) of each place the module ``tree`` names a model family in its code: a string
    constant that is a family's name (docstrings left out: they may name one), or an import of a
    family's folder ``tasks.<folder>`` (at any level of a function)."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs and n.value in names:
            out.append((n.lineno, repr(n.value)))
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            for m in [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]:
                if m.split(".")[:2] in (["tasks", f] for f in folders):
                    out.append((n.lineno, f"import {m}"))
    return sorted(out)


#: modules outside a family's folder that still name one in code, and why; each must still do so
#: (a module that no longer does leaves this list), so it only shrinks
NAMES_A_FAMILY: dict[str, str] = {}  # {module: why it still names a family}: none now


def test_a_family_is_named_in_its_folder_and_the_registry_only():
    """A family is one folder (``tasks/<folder>/family.py``, its :class:`Family` declaration)
    plus one line of ``tasks.contract.FAMILIES``: no other module names a family in code (no
    family's name as a string, no import of its folder), so the engine (``tasks/core/``), the
    commands (``tasks/commands/``), the recipe format and the plan reach a family only through
    ``tasks.contract.family(name)``."""
    from tasks.contract import FAMILIES, family

    names, folders = set(FAMILIES), _family_folders()
    assert {"encoder", "llm"} <= names and {"encoder", "llm"} <= folders
    for name, module in FAMILIES.items():  # each declaration sits in its folder, under its name
        assert module == f"tasks.{module.split('.')[1]}.family" and family(name).name == name
    # the finder finds what it looks for: the test of a family and the import this forbids
    probe = ast.parse('"""llm"""\nif ex.family == "llm":\n    from tasks.llm.figures import f\nimport tasks.qnn\n')
    assert _names_a_family(probe, names, folders) == [(2, "'llm'"), (3, "import tasks.llm.figures")]
    found, read = [], 0
    for f in _modules("contract/__init__.py"):
        rel = f.relative_to(REPO / "tasks").as_posix()
        if rel.split("/")[0] in folders:
            continue
        read += 1
        named = _names_a_family(ast.parse(f.read_text(encoding="utf-8")), names, folders)
        if rel in NAMES_A_FAMILY:
            assert named, f"{rel} names no family now: take it out of NAMES_A_FAMILY"
            continue
        found += [(rel, line, what) for line, what in named]
    assert found == [], found
    assert read >= 60  # the package was really read


def test_no_stage_implementation_imports_another():
    """A stage's code digest covers every module its implementation imports (tasks/core/keys.py),
    so one implementation importing another (for a shared param, say) would rebuild it whenever
    the other changes: what several implementations share lives in ``tasks/contract/params.py``
    or a library module."""
    from tasks.contract import implementation_modules

    impls = set(implementation_modules())
    bad = {m: sorted(impls & direct_imports(m)) for m in sorted(impls)}
    assert {m: b for m, b in bad.items() if b} == {}
    assert len(impls) >= 14


def test_each_stages_params_are_exactly_what_its_implementation_declares(monkeypatch):
    """The plan only wires; a stage's params are the recipe keys its family's implementation
    lists (``STAGE.params``; nested ones nested) plus what the plan wires in (``STAGE.wired``:
    ``target``, ``part``...), its files what ``STAGE.files`` names."""
    monkeypatch.setenv("NPUBUILD_ROOT", str(REPO))
    from tasks.recipe.plan import expand
    from tasks.recipe.load import load_recipe

    for name in ("minilm-l6-w4a16", "tiny-qwen2-w4a16", "qwen7b-int4"):
        for spec in expand(load_recipe(REPO / "recipes" / f"{name}.yaml")):
            st = spec.impl
            if st.whole:
                assert set(spec.params) <= set(st.whole_model().model_fields), (name, spec.kind)
                continue
            top = {p.path.split(".")[0] for p in st.params}
            assert top <= set(spec.params) <= top | set(st.wired), (name, spec.kind, sorted(spec.params))
            for p in st.params:
                if "." in p.path:
                    outer, inner = p.path.split(".")
                    assert inner in spec.params[outer], (name, spec.kind, p.key)
            assert set(spec.files) <= set(st.files.values()), (name, spec.kind, spec.files)


def test_no_import_cycles_between_subfolders():
    """Issue 24: with each subfolder of ``tasks/`` (encoder, llm, contract, proc, patches, core, qnn, store, recipe,
    ...) drawn as
    one node beside the top-level modules, the import graph has no cycle."""

    def node(m):
        parts = m.split(".")
        return parts[1] if (REPO / "tasks" / parts[1]).is_dir() else m

    mods = package_modules()
    graph: dict[str, set] = {}
    for m in mods:
        graph.setdefault(node(m), set()).update(node(d) for d in direct_imports(m) if d in mods and node(d) != node(m))
    cycles = import_cycles(graph)
    assert {"encoder", "llm", "contract", "proc", "patches", "core", "qnn", "store", "recipe"} <= set(graph)
    assert cycles == [], cycles


def test_every_recipe_param_has_exactly_one_definition():
    """Each recipe key of a stage section is one Param object (its type, default, range and
    description in one place): no two objects define one key, every field of the assembled
    sections is a declared Param and every declared Param a field, each with a description and
    at least one family that reads it."""
    from pydantic import BaseModel

    from tasks.recipe.load import SECTION_MODELS
    from tasks.contract import implementations
    from tasks.contract.schema import declared, plan_params, readers

    listed = [*plan_params(), *(p for st in implementations() for p in st.reads())]
    by_key: dict = {}
    for p in listed:
        assert by_key.setdefault(p.key, p) is p, f"{p.key} defined twice"
    assert sorted(by_key) == sorted(p.key for ps in declared().values() for p in ps)

    def fields(model, prefix=""):
        for name, f in model.model_fields.items():
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):  # a group: calibration, data
                yield from fields(f.annotation, prefix + name + ".")
            else:
                yield prefix + name

    assembled = sorted(f"{s}.{k}" for s, m in SECTION_MODELS.items() for k in fields(m))
    assert assembled == sorted(by_key), set(assembled) ^ set(by_key)
    for p in by_key.values():
        assert p.description and readers(p), p.key
    assert len(by_key) >= 30


def test_every_param_an_implementation_reads_is_declared():
    """Every ``params["x"]`` / ``params.get("x")`` (and ``params["x"]["y"]``) in the functions of a
    stage implementation's module that its hooks reach (``run``, ``key_extra``, ``check``...,
    and what they call in the module) names a key it declares: a recipe param it lists, a key
    of the section it takes whole, or one the plan wires in. An undeclared read would see
    nothing the key hashed."""
    from importlib import import_module

    from tasks.contract import implementations

    def reads(tree):
        for n in ast.walk(tree):
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant):
                inner = n.value
                if isinstance(inner, ast.Name) and inner.id == "params":
                    yield (n.slice.value,)
                elif (
                    isinstance(inner, ast.Subscript)
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id == "params"
                    and isinstance(inner.slice, ast.Constant)
                ):
                    yield (inner.slice.value, n.slice.value)
            if (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and n.func.attr == "get"
                and isinstance(n.func.value, ast.Name)
                and n.func.value.id == "params"
                and n.args
                and isinstance(n.args[0], ast.Constant)
            ):
                yield (n.args[0].value,)

    count = 0
    for st in implementations():
        ok = {tuple(p.path.split(".")) for p in st.reads()} | {(w,) for w in st.wired}
        ok |= {k[:1] for k in ok}
        if st.whole:
            ok |= {(k,) for k in st.whole_model().model_fields}
        tree = ast.parse(Path(import_module(st.module).__file__).read_text(encoding="utf-8"))
        funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        todo = [
            f.__name__
            for f in (st.run, st.key_extra, st.check, st.check_read, st.preflight)
            if f is not None and f.__module__ == st.module
        ]
        seen: set = set()
        while todo:
            name = todo.pop()
            if name in seen or name not in funcs:
                continue
            seen.add(name)
            todo += [n.id for n in ast.walk(funcs[name]) if isinstance(n, ast.Name)]
        for r in (r for name in sorted(seen) for r in reads(funcs[name])):
            count += 1
            assert r in ok, f"{st.module} reads params{''.join(f'[{k!r}]' for k in r)}, which STAGE does not declare"
    assert count >= 30


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
            if isinstance(value, mutable) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set", "defaultdict")
            ):
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


#: The module-level mutable containers the package keeps, each a registry or a fact of the
#: whole process, with why it is not a command's (``tasks.core.session.Session``).
MODULE_STATE = {
    "tasks.patches.REGISTRY": "the registry: each patch module registers its patches when imported",
    "tasks.proc.child._RUNNING": "the children this process runs, any thread's: stopped with it on Ctrl-C",
    "tasks.store.stagelog._STREAMS": "one text stream per file descriptor of this process (its stdout/stderr)",
    "tasks.store.paths._MEMO": "a pure function's memo, keyed by the environment values it reads",
    "tasks.sources.download._HASHED": "content digest -> the listing it hashes: true in any session",
}
_MUTATORS = {
    "add",
    "append",
    "update",
    "setdefault",
    "pop",
    "popitem",
    "clear",
    "discard",
    "extend",
    "insert",
    "remove",
}


def _module_state() -> dict[str, int]:
    """{module.NAME: line} of every module-level name bound to a mutable container (a dict,
    list or set display, comprehension or call) that its module mutates (a mutating method
    call, an item assigned or deleted), or rebinds under ``global``."""
    mutable = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
    found = {}
    for f in _modules():
        parts = f.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(f.read_text(encoding="utf-8"))
        containers = {}
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                v = node.value
                if isinstance(v, mutable) or (
                    isinstance(v, ast.Call)
                    and ast.unparse(v.func).split(".")[-1]
                    in ("dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter")
                ):
                    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                        if isinstance(t, ast.Name):
                            containers[t.id] = node.lineno
        changed = set()
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _MUTATORS
                and isinstance(node.func.value, ast.Name)
            ):
                changed.add(node.func.value.id)
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                        changed.add(t.value.id)
            if isinstance(node, ast.Global):
                changed.update(n for n in node.names if n in containers)
        found.update({f"{module}.{n}": line for n, line in containers.items() if n in changed})
    return found


def test_module_level_state_is_a_registry_or_a_process_wide_fact():
    """At most 5 module-level mutable containers in the package, each listed in
    :data:`MODULE_STATE` with its reason; a command's memos are its session's."""
    found = _module_state()
    assert sorted(found) == sorted(MODULE_STATE), sorted(set(found) ^ set(MODULE_STATE))
    assert len(MODULE_STATE) <= 5


def test_no_command_imports_another_commands_modules():
    """The commands stand side by side (``tasks/commands/<x>``: a module or a package): no
    module of one imports a module of another. What two share is lower: :mod:`tasks.core`
    (a recipe's state and catalog row, ``build/<recipe>/``, the errors that explain themselves)
    or a module below the commands; ``dodo.py`` collects each command's task creators."""
    root = REPO / "tasks" / "commands"
    commands = sorted(
        p.stem
        for p in root.iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())
    )
    assert {"builder", "cache", "catalog", "cluster", "publish"} <= set(commands)

    def command_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if parts[:2] == ["tasks", "commands"] and len(parts) > 2 else None

    found = []
    for m in package_modules():
        mine = command_of(m)
        if mine is None:
            continue
        for d in direct_imports(m):
            theirs = command_of(d)
            if d == "tasks.commands" or (theirs is not None and theirs != mine):
                found.append((m, d))
    assert found == [], found
    # and nothing below the commands imports them
    below = [
        (m, d)
        for m in package_modules()
        if not m.startswith("tasks.commands")
        for d in direct_imports(m)
        if d.startswith("tasks.commands")
    ]
    assert below == [], below


def test_no_module_passes_450_lines():
    """Every module of the package has at most 450 lines (a module does one job); no exceptions."""
    found = []
    for f in sorted((REPO / "tasks").rglob("*.py")):
        rel = f.relative_to(REPO).as_posix()
        n = len(f.read_text(encoding="utf-8").splitlines())
        if n > 450:
            found.append((rel, n))
    assert found == [], found


def _exception_classes() -> list[tuple[str, str]]:
    """(module, class name) of every exception class ``tasks/`` defines, found from the source:
    a class whose base is a built-in exception or another such class, by name."""
    import builtins

    known = {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    }
    classes = []
    for f in _modules():
        parts = f.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(f.read_text(encoding="utf-8"))
        classes += [(module, node, node in tree.body) for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]

    def base_name(b):
        return b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)

    found, grew = set(), True
    while grew:
        grew = False
        for module, node, top in classes:
            if (module, node.name) not in found and any(base_name(b) in known for b in node.bases):
                assert top, f"{module}.{node.name}: an exception class inside another definition"
                found.add((module, node.name))
                known.add(node.name)
                grew = True
    return sorted(found)


#: The exception classes of the package that are not :class:`tasks.errors.UserError`, and why:
#: should one reach a command, it shows with its traceback (``tasks.errors.shown``). Every
#: other class explains itself and shows as its message alone.
SHOWN_WITH_TRACEBACK = {
    "tasks.errors.NpubuildError": "the base; raised as such nowhere",
    "tasks.core.keys.NotReady": "an internal signal: resolve, state, status and cluster catch it",
    "tasks.store.remote.Rejected": "an internal signal: a remote entry failing its check is a miss (entries, "
    "cache push, cluster catch it)",
    "tasks.qnn.libgenie.GenieError": "a Genie C API call's status: the traceback names the call",
}


def test_every_exception_class_is_shown_by_its_base_alone():
    """Each exception class ``tasks/`` defines derives from ``NpubuildError``, and how a command
    shows it (``tasks.errors.shown``: its message and notes as lines, or None: its traceback)
    follows from its base alone: a ``UserError`` is its message, any other is a traceback, and
    the classes that are not ``UserError`` are exactly :data:`SHOWN_WITH_TRACEBACK`."""
    import importlib

    from tasks.errors import NpubuildError, UserError, shown

    found = _exception_classes()
    assert len(found) >= 25, found  # the finder still finds them
    wrong, traceback = [], set()
    for module, name in found:
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, BaseException), (module, name)
        if not issubclass(cls, NpubuildError):
            wrong.append(f"{module}.{name}")
            continue
        err = cls.__new__(cls)  # without its own __init__'s arguments (Mismatch takes lines, ...)
        err.add_note("log: /where/the/log/is")
        text = shown(err)
        if text is None:
            traceback.add(f"{module}.{name}")
        else:
            assert text.startswith(f"{name}: ") and text.endswith("\nlog: /where/the/log/is"), (name, text)
        assert (text is not None) == issubclass(cls, UserError), (module, name)
    assert wrong == [], wrong
    assert traceback == set(SHOWN_WITH_TRACEBACK), traceback ^ set(SHOWN_WITH_TRACEBACK)
    assert shown(ValueError("a bug's")) is None and shown(KeyError("k")) is None


def test_no_command_lists_error_types_to_show_them():
    """A command's action shows an error that explains itself by catching ``UserError`` and
    calling ``tasks.errors.shown``: no ``except`` of a command names another class of ours, or
    a list computed for it (a hand list went stale: 16 types, 11 modules imported for them)."""
    import builtins

    ok = {"UserError"} | {
        n
        for n in dir(builtins)
        if isinstance(getattr(builtins, n), type) and issubclass(getattr(builtins, n), BaseException)
    }
    found, seen = [], 0
    for f in sorted((REPO / "tasks" / "commands").rglob("cli.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                names = [ast.unparse(t) for t in (node.type.elts if isinstance(node.type, ast.Tuple) else [node.type])]
                seen += "UserError" in names
                if any(n not in ok for n in names):
                    found.append((f.relative_to(REPO).as_posix(), node.lineno, names))
    assert found == [], found
    assert seen >= 6


def test_the_errors_module_imports_nothing_of_the_package():
    tree = ast.parse((REPO / "tasks" / "errors.py").read_text(encoding="utf-8"))
    imported = [
        n.module if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    ]
    relative = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert relative == [] and not [m for m in imported if m and m.split(".")[0] == "tasks"], imported


#: Folders of tests/ that are not (yet) a folder of tasks/, and what they test (none now: every
#: layer has its folder).
TEST_FOLDERS_AHEAD: dict[str, str] = {}
#: Test files at tests/ root, each about the package as a whole rather than one folder of it.
ROOT_TESTS = {
    "test_layout.py": "the layout of every folder of tasks/, and of tests/ (this test)",
    "test_fault_campaign.py": "runs benchmarks/fault_campaign.py: whole builds killed and run concurrently, all layers",
}


def test_every_test_file_sits_in_the_folder_of_the_code_it_tests():
    """tests/ mirrors tasks/: a test file sits in tests/<folder>/ for a folder tasks/<folder>/
    (or one of TEST_FOLDERS_AHEAD), or at tests/ root if ROOT_TESTS lists it. Basenames are
    unique (pytest's default import mode, no __init__.py), and a test file imports other test
    files only from its own folder: what several folders share is a helper module at tests/ root."""
    tests = REPO / "tests"
    files = sorted(tests.rglob("test_*.py"))
    assert len(files) > 40  # the tree was really read
    misplaced, by_name, cross = [], {}, []
    for f in files:
        rel = f.relative_to(tests)
        folder = rel.parent.as_posix()
        by_name.setdefault(f.name, []).append(rel.as_posix())
        if folder == ".":
            ok = f.name in ROOT_TESTS
        else:
            ok = (REPO / "tasks" / folder / "__init__.py").exists() or folder in TEST_FOLDERS_AHEAD
        if not ok:
            misplaced.append(rel.as_posix())
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                if top.startswith("test_") and not (f.parent / f"{top}.py").exists():
                    cross.append(f"{rel.as_posix()}:{node.lineno} imports {top}")
    assert misplaced == [], misplaced
    assert {n: p for n, p in by_name.items() if len(p) > 1} == {}
    assert cross == [], cross
    assert sorted(ROOT_TESTS) == sorted(f.name for f in tests.glob("test_*.py"))  # the list stays true
    assert [d for d in TEST_FOLDERS_AHEAD if (REPO / "tasks" / d).is_dir()] == []


#: The modules at tasks/ top level: leaves every layer may import (each imports nothing of the
#: package but tasks/proc/ and tasks/errors.py), with what each holds. Everything else lives in
#: a layer's folder.
LEAVES = {
    "errors.py": "the bases of every error the package raises on purpose",
    "tools.py": "the versions of the tools that enter a stage key",
    "metrics.py": "the comparisons every family's verify makes",
    "datafiles.py": "recipe data files as every stage reads them",
    "progress.py": "progress bars on a terminal",
}
#: The layer folders of tasks/ (docs/layout.md draws them) beside the families' (tasks.contract.FAMILIES).
LAYERS = {"commands", "core", "sources", "patches", "recipe", "contract", "qnn", "store", "proc"}


def test_tasks_top_level_holds_the_layer_folders_and_the_leaves_only():
    top = REPO / "tasks"
    assert sorted(f.name for f in top.glob("*.py")) == sorted(LEAVES)
    assert {d.name for d in top.iterdir() if d.is_dir() and d.name != "__pycache__"} == LAYERS | _family_folders()
    for leaf in LEAVES:
        bad = [
            d for d in direct_imports("tasks." + leaf[:-3]) if not d.startswith("tasks.proc") and d != "tasks.errors"
        ]
        assert bad == [], (leaf, bad)


def test_tests_skip_only_through_the_one_policy():
    """A test that needs something this machine may lack calls ``conftest.needs`` (skipped off
    root, failed on root, where CI runs): no other skip in tests/ (``pytest.skip``, ``skipif``,
    ``importorskip``), so a missing tool or right cannot hide what a test guards."""
    found = []
    for f in sorted((REPO / "tests").rglob("*.py")):
        if f.name == "conftest.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in ("skip", "skipif", "importorskip")
                and isinstance(node.value, (ast.Name, ast.Attribute))
            ):
                found.append(f"{f.relative_to(REPO).as_posix()}:{node.lineno} {node.attr}")
    assert found == [], found


def test_the_skip_policy_fails_as_root_and_names_the_skip_otherwise(tmp_path):
    """``needs(False, ...)`` through pytest itself: a failure when the run is root (as CI), a
    skip named in the summary when it is not."""
    import os
    import subprocess
    import sys

    (tmp_path / "test_x.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from conftest import needs\n\n"
        "def test_x():\n    needs(False, 'a right this run lacks')\n"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-rs",
            "-o",
            "addopts=",
            str(tmp_path / "test_x.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    if os.geteuid() == 0:
        assert out.returncode == 1 and "1 failed" in out.stdout and "this run is root" in out.stdout, out.stdout
    else:
        assert out.returncode == 0 and "1 skipped" in out.stdout, out.stdout + out.stderr
        assert "SKIPPED" in out.stdout and "a right this run lacks" in out.stdout, out.stdout


def test_nothing_in_the_repo_points_at_notes_outside_it():
    """Docstrings and docs say what an outside note found, never its path: the notes beside the
    project are not in a clone (``../shared/NOTES-qnn.md`` was cited in 17 places)."""
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = ("NOTES-qnn", "NOTES-build", "../shared/", "/work/shared")
    hits = [
        f"{f}: {w}"
        for f in files
        if f.endswith((".py", ".md", ".yaml", ".toml", ".txt", ".sh")) and f != "tests/test_layout.py"
        for w in outside
        if w in (REPO / f).read_text(encoding="utf-8", errors="replace")
    ]
    assert not hits, hits
