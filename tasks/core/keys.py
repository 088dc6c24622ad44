"""Stage keys: where the key of every stage (quantize included) is computed.

The stage key (xxh3-128 of canonical JSON, :func:`key_material` + :func:`stage_key`) covers:

- the stage kind, the module that implements it for the recipe's family and its ``VERSION``;
- the digest of the source files that implement it (:func:`code_digest`: the import graph of
  the implementation module, found from the source: :func:`code_modules`);
- its resolved params (minus the implementation's ``key_exclude``, e.g. verify thresholds, which
  judge a result but do not change it);
- the output digests of its upstream entries and the content digests of the project files
  it reads, never their paths and never the recipe name, so two recipes whose stages agree
  share one entry; and since an upstream enters by its *output* digest, a rebuilt upstream
  with byte-identical output leaves its downstream up to date (early cut-off);
- the versions of the tools in the implementation's ``tools``;
- whatever its optional ``key_extra(params)`` adds (a local source folder's digest, a Hub
  revision resolved to its commit).

The implementation is the ``STAGE`` (:class:`tasks.contract.stage.Stage`) that
``spec.impl`` names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tasks import tools
from tasks.store import digest
from tasks.store import paths
from tasks.errors import InputMissing, NpubuildError
from tasks.core.session import Session

#: the folder of the ``tasks`` package, and its name: the modules a code digest may cover
PACKAGE_DIR = Path(__file__).resolve().parent.parent
PACKAGE = __name__.split(".")[0]


class NotReady(NpubuildError):
    """An upstream stage has no cache entry yet, so this stage's key cannot be computed."""


def project_file(rel: str) -> Path:
    """A recipe's data file, relative to the project root. Raises FileNotFoundError."""
    p = (paths.root() / rel).absolute()
    if not p.is_file():
        raise InputMissing(f"data file {rel!r} not found (looked at {p})")
    return p


def key_material(session: Session, spec, upstream: dict) -> dict:
    """Everything the key of ``spec`` (a :class:`tasks.recipe.plan.StageSpec`) is the hash of, as a
    plain JSON-able dict: kind, impl, version, params, inputs, files, tools, code and, when the
    module has ``key_extra``, extra. ``upstream`` maps each role in ``spec.inputs`` to an
    object with an ``output_digest`` (its committed Entry). Raises FileNotFoundError for a
    missing data file, KeyError for a role missing from ``upstream``, and what ``key_extra``
    raises (e.g. a source that cannot be found)."""
    st = spec.impl
    material = {
        "kind": spec.kind,
        "impl": st.module,  # the family's implementation of the kind (tasks.contract)
        "version": st.version,
        "params": {k: v for k, v in spec.params.items() if k not in st.key_exclude},
        "inputs": {role: upstream[role].output_digest for role in spec.inputs},
        "files": {role: digest.file_digest(project_file(rel)) for role, rel in spec.files.items()},
        "tools": tools.versions(st.tools),
        "code": code_digest(session, spec),
    }
    if st.key_extra:
        material["extra"] = st.key_extra(spec.params)
    return material


def stage_key(material: dict) -> str:
    """The stage key: xxh3-128 hex (32 characters) of the canonical JSON of ``material``."""
    return digest.digest_json(material)


def remote_key(manifest: dict) -> str:
    """The stage key recomputed from a manifest's ``material`` (what a remote entry is checked
    against before it is used). Raises KeyError when the manifest has no key material."""
    return stage_key(manifest["material"])


# ------------------------------------------------------------ the import-graph code digest


def module_file(session: Session, name: str) -> Path | None:
    """The source file of module ``name`` of this package (``tasks.a.b`` -> ``tasks/a/b.py`` or
    ``tasks/a/b/__init__.py``), found on disk without importing anything; None if there is none
    (e.g. ``tasks.store.paths.root``, a function). Remembered in ``session.module_files``."""
    if name in session.module_files:
        return session.module_files[name]
    found = None
    parts = name.split(".")
    if parts[0] == PACKAGE:
        base = PACKAGE_DIR.joinpath(*parts[1:])
        found = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
    session.module_files[name] = found
    return found


def direct_imports(session: Session, name: str) -> frozenset[str]:
    """The modules of this package that module ``name`` imports itself (``import``/``from``
    statements anywhere in its source, functions included; read with ``ast``, nothing
    imported). Empty for a name with no source file. Raises SyntaxError for a module that
    does not parse. The parse is kept in the stat cache under the file's content digest
    (:meth:`tasks.store.digest.StatCache.derived`), so an unchanged file is parsed once, not by every
    process; and in ``session.imports`` for the rest of the session."""
    if name in session.imports:
        return session.imports[name]
    f = module_file(session, name)
    if f is None:
        found = frozenset()
    else:
        is_pkg = f.name == "__init__.py"
        targets = json.loads(
            digest.default_stat_cache().derived(
                f"imports:{name}",
                digest.file_digest(f),
                lambda: json.dumps(_import_targets(f, name, is_pkg)),
                reader=Path(__file__),
            )
        )
        found = frozenset(t for t in targets if t != name and module_file(session, t) is not None)
    session.imports[name] = found
    return found


def _import_targets(f: Path, name: str, is_pkg: bool) -> list[str]:
    """Every dotted name an ``import``/``from`` statement of source file ``f`` (module
    ``name``) may refer to, relative imports resolved; sorted."""
    import ast

    out = set()
    for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.update([stem] + [f"{stem}.{a.name}" for a in node.names])
    return sorted(out)


def code_modules(session: Session, name: str) -> tuple[str, ...]:
    """``name`` and every module of this package it imports, directly or through others, at
    any depth and inside functions too (:func:`direct_imports`), and the ``__init__`` of every
    package on the way (it runs when a submodule is imported: module traces showed
    ``tasks.encoder`` loaded in verify's children, tests/test_keys.py): the code a stage runs.
    Sorted dotted names, remembered in ``session.code_modules``. Raises SyntaxError for a
    module that does not parse."""
    if name in session.code_modules:
        return session.code_modules[name]
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod in seen or module_file(session, mod) is None:
            continue
        seen.add(mod)
        todo.extend(direct_imports(session, mod))
        todo.extend(mod.rsplit(".", k)[0] for k in range(1, mod.count(".")))  # its parent packages
    session.code_modules[name] = tuple(sorted(seen))
    return session.code_modules[name]


def _stamp(session: Session, names) -> tuple:
    out = []
    for n in names:
        st = os.stat(module_file(session, n))
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def code_files(session: Session, spec) -> dict[str, str]:
    """{dotted module name: xxh3 of its source} for the modules :func:`code_digest` covers,
    sorted by name (what a cluster worker compares to name the module that differs). Worked
    out once per session for each stage implementation (and patch steps) and reused while the
    files' stats are unchanged (a plain ``os.stat`` each, no stat-cache query). Raises
    SyntaxError for a module that does not parse, KeyError for an unknown patch step."""
    k = (spec.impl.module, tuple(s["name"] for s in spec.params["steps"]) if spec.kind == "patch" else ())
    hit = session.code_files.get(k)
    if hit is not None and _stamp(session, hit[1]) == hit[0]:
        return dict(hit[1])
    files = _code_files(session, spec)
    session.code_files[k] = (_stamp(session, files), files)
    return dict(files)


def _code_files(session: Session, spec) -> dict[str, str]:
    st = spec.impl
    names = set(code_modules(session, st.module))
    for dep in st.code_deps:  # modules found by name at run time, not imported
        names.update(code_modules(session, dep))
    if spec.kind == "patch":
        from tasks import patches

        for s in spec.params["steps"]:
            names.update(code_modules(session, patches.get(s["name"]).fn.__module__))
    return {n: digest.file_digest(module_file(session, n)) for n in sorted(names)}


def code_digest(session: Session, spec) -> str:
    """xxh3 (32 hex) of the source files that implement ``spec``: every module of this package
    that its stage module imports, at any depth (:func:`code_modules`; the target table, the
    LLM helpers, ...) and, for a patch stage, each step's patch module (patches are found by
    name, not imported). A hand-bumped ``VERSION`` or a hand-kept list of dependencies is easy
    to forget; the import graph cannot be forgotten. Keyed by dotted module name
    (``tasks.llm.export`` and ``tasks.encoder.export`` are two files)."""
    return digest.digest_json(code_files(session, spec))
