"""Stage keys, and running one stage through the cache.

The stage key (xxh3-128 of canonical JSON, :func:`key_material` + :func:`stage_key`) covers:

- the stage kind, and the module and ``version`` of its implementation (``STAGE``,
  :class:`tasks.stages.contract.Stage`);
- its resolved params (minus the implementation's ``key_exclude``, e.g. verify thresholds,
  which judge a result but do not change it);
- the output digests of its upstream entries and the content digests of the project files
  it reads, never their paths and never the recipe name, so two recipes whose stages agree
  share one entry; and since an upstream enters by its *output* digest, a rebuilt upstream
  with byte-identical output leaves its downstream up to date (early cut-off);
- the versions of the tools in the implementation's ``tools``;
- whatever its optional ``key_extra(params)`` adds (a local source folder's digest,
  a Hub revision resolved to its commit).

This module knows nothing of doit; ``tasks/dodo_tasks.py`` wraps it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import lru_cache
from pathlib import Path

from . import digest, paths, plancache, remote, tools
from .proc import interrupt, rss
from .cache import Cache, Entry
from .plan import StageSpec, expand


class StageFailed(Exception):
    """A stage ran and its result does not pass (e.g. verify below threshold)."""


class NotReady(Exception):
    """An upstream stage has no cache entry yet, so this stage's key cannot be computed."""


class UpstreamUnusable(Exception):
    """A stage failed reading the files of an upstream cache entry (the error names a path in
    it): the message names the entry and how to drop it, so the next build rebuilds it."""


def _names_entry(err: BaseException, upstream: dict[str, Entry]) -> Entry | None:
    """The entry of ``upstream`` whose folder ``err``, or an error it was raised from, names
    (its message or its ``filename``), when ``err`` is not one of ours (``tasks.*``: those
    say what is wrong themselves) and not an interrupt, a full disk or a ``ValueError`` other
    than an OSError (a recipe's value the entry does not fit: rebuilding it would not help)."""
    from .cache import _disk_full

    if isinstance(err, KeyboardInterrupt) or _disk_full(err) or type(err).__module__.startswith("tasks."):
        return None
    if isinstance(err, ValueError) and not isinstance(err, OSError):
        return None
    seen, texts = set(), []
    e = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts += [str(e), str(getattr(e, "filename", "") or "")]
        e = e.__cause__ or e.__context__
    for entry in upstream.values():
        if any(str(entry.path) + os.sep in t or t.endswith(str(entry.path)) for t in texts):
            return entry
    return None


def remote_key(manifest: dict) -> str:
    """The stage key recomputed from a manifest's ``material`` (what a remote entry is checked
    against before it is used). Raises KeyError when the manifest has no key material."""
    return stage_key(manifest["material"])


def cache() -> Cache:
    """The local cache, with the remote level when ``NPUBUILD_REMOTE`` is set. Raises
    ValueError for a relative NPUBUILD_CACHE or a remote URL fsspec cannot open."""
    return Cache(paths.cache_dir(), remote=remote.from_env(), key_of=remote_key, on_quarantine=unlink_build_copies)


def unlink_build_copies(kind: str, key: str) -> list[Path]:
    """Remove, from every ``build/<recipe>/`` folder, the files that are links (or copies) of
    cache entry ``kind/key`` (as its ``artifacts.json`` lists them), and that
    ``artifacts.json``, so the next ``doit build:<recipe>`` links them anew (its up-to-date
    check needs ``artifacts.json``). Called when the entry is quarantined: those hard links
    share the damaged bytes. Returns the folders changed; raises only what the file system
    raises."""
    _INTACT.pop((kind, key), None)
    changed = []
    prefix = f"{kind}/{key}/"
    for art in sorted(paths.build_dir().glob("*/artifacts.json")):
        try:
            listing = json.loads(art.read_text(encoding="utf-8"))
            mine = [f for f, src in listing.items() if str(src).startswith(prefix)]
        except (OSError, ValueError, AttributeError):
            mine = []  # unreadable: the next build rewrites it anyway
        if mine:
            for f in mine:
                (art.parent / f).unlink(missing_ok=True)
            art.unlink(missing_ok=True)
            changed.append(art.parent)
    return changed


class RecipeSet:
    """One state of the recipes folder, as a command sees it: the valid recipes' names and
    stage specs, from the plan cache (:mod:`tasks.plancache`: no YAML parsing, no pydantic)
    when it matches, else from loading every recipe file (which then refreshes the plan
    cache when every file was valid). :meth:`full` loads the recipes themselves on demand."""

    def __init__(self, recipes_dir: str, stamp: tuple):
        self.dir = recipes_dir
        self._full: tuple[dict, dict] | None = None
        self._plans: dict[str, dict[str, StageSpec]] = {}
        sig = plancache.signature(recipes_dir, stamp)
        stored = plancache.load(paths.state_dir(), sig)
        try:
            for n, row in (stored or {}).items():
                if row["specs"] is not None:
                    self._plans[n] = {d["name"]: StageSpec(**d) for d in row["specs"]}
        except (TypeError, KeyError):  # rows of another shape: load the recipes
            stored, self._plans = None, {}
        self.from_plan_cache = stored is not None
        if stored is None:
            from .errors import UnsupportedModel

            with plancache.recording() as noted:
                recipes, errors = self.full()
            stored = {n: {"abstract": r.abstract, "specs": None} for n, r in recipes.items()}
            # a valid recipe of a model not implemented yet is stored with its one reason, so a
            # folder holding one still gets the plan cache (the others are still loaded every time)
            stored.update({n: {"abstract": False, "specs": None, "unsupported": [e.file, [list(p) for p in e.problems]]}
                           for n, e in errors.items() if isinstance(e, UnsupportedModel)})
            if all(isinstance(e, UnsupportedModel) for e in errors.values()):
                try:
                    for n, r in recipes.items():
                        if not r.abstract:
                            self._plans[n] = {s.name: s for s in expand(r)}
                            stored[n]["specs"] = [vars(s) for s in self._plans[n].values()]
                except Exception:  # a recipe that cannot be expanded: its build task reports it
                    pass
                else:
                    plancache.save(paths.state_dir(), sig, noted, stored)
        self.abstract = {n: row["abstract"] for n, row in stored.items() if "unsupported" not in row}  # valid ones
        self._unsupported = {n: row["unsupported"] for n, row in stored.items() if "unsupported" in row}

    def full(self) -> tuple[dict, dict]:
        """(recipes by name, {file stem: RecipeError}): every recipe file loaded and checked."""
        if self._full is None:
            from .recipe import load_all

            self._full = load_all(Path(self.dir), collect_errors=True)
        return self._full

    def errors(self) -> dict:
        """{file stem: RecipeError}; from the plan cache, its unsupported recipes' errors."""
        if self.from_plan_cache:
            from .errors import UnsupportedModel

            return {n: UnsupportedModel(f, [tuple(p) for p in problems]) for n, (f, problems) in self._unsupported.items()}
        return self.full()[1]

    def plan(self, recipe_name: str) -> dict[str, StageSpec]:
        if recipe_name not in self._plans:
            self._plans[recipe_name] = {s.name: s for s in expand(self.full()[0][recipe_name])}
        return self._plans[recipe_name]


@lru_cache(maxsize=None)
def _recipes_cached(recipes_dir: str, stamp: tuple) -> RecipeSet:
    return RecipeSet(recipes_dir, stamp)


_PINNED: RecipeSet | None = None
_INTACT: dict[tuple[str, str], Entry] = {}  # (kind, key) -> entry found intact, while pinned
_MATERIALS: dict[str, dict] = {}  # the same stage of several recipes -> its key material, while pinned
_STATES: dict[str, dict] = {}  # recipe -> its stages.json as read or written, while pinned


def pin_recipes() -> None:
    """Freeze the recipe set (and the entries found intact) for the rest of this process: a doit
    command makes its task list once, then asks every stage task whether it is up to date, and
    re-reading the recipes folder (a stat per file) and re-checking an entry shared by many
    recipes for each of those questions was most of a no-op build's time (issue 11). Called by
    ``tasks/dodo_tasks.py`` when it lists the tasks; a long-lived process (a cluster worker)
    never pins, so it sees edits and re-checks entries on every use."""
    global _PINNED
    _PINNED = None
    for memo in (_INTACT, _MATERIALS, _STATES):
        memo.clear()
    _PINNED = _load()


def _load() -> RecipeSet:
    if _PINNED is not None:
        return _PINNED
    d = str(paths.recipes_dir())
    try:
        with os.scandir(d) as it:  # one stat per file, no Path objects: this runs per task
            stamp = tuple(sorted(_scan_stat(e) for e in it if e.name.endswith(".yaml") and not e.name.startswith(".")))
    except OSError:
        stamp = ()
    return _recipes_cached(d, stamp)


def _scan_stat(e) -> tuple:
    try:
        st = e.stat()  # follows symlinks, like Path.stat
    except OSError:  # a dangling symlink: load_all reports it
        return (e.name, None, None)
    return (e.name, st.st_mtime_ns, st.st_size)


def recipes() -> dict:
    """The valid recipes by name, reloaded when a recipe file changed (keyed by the stats)."""
    return _load().full()[0]


def recipe_names() -> dict[str, bool]:
    """{name: abstract} of the valid recipes; from the plan cache when it matches (a no-op
    command never parses a recipe)."""
    return dict(_load().abstract)


def recipe_errors() -> dict:
    """{file stem: RecipeError} for every invalid recipe file."""
    return _load().errors()


def plan(recipe_name: str) -> dict[str, StageSpec]:
    """{stage name: spec} of one recipe, in build order (expanded once per recipe set).
    Raises KeyError for a recipe that is not in the set."""
    return dict(_load().plan(recipe_name))


def project_file(rel: str) -> Path:
    """A recipe's data file, relative to the project root. Raises FileNotFoundError."""
    p = (paths.root() / rel).absolute()
    if not p.is_file():
        raise FileNotFoundError(f"data file {rel!r} not found (looked at {p})")
    return p


def key_material(spec: StageSpec, upstream: dict[str, Entry]) -> dict:
    """Everything the key of ``spec`` is the hash of (a plain dict). ``upstream`` maps each
    role in ``spec.inputs`` to its committed entry."""
    st = spec.impl
    params = {k: v for k, v in spec.params.items() if k not in st.key_exclude}
    material = {
        "kind": spec.kind,
        "impl": st.module,  # the family's implementation of the kind (tasks.stages)
        "version": st.version,
        "params": params,
        "inputs": {role: upstream[role].output_digest for role in spec.inputs},
        "files": {role: digest.file_digest(project_file(rel)) for role, rel in spec.files.items()},
        "tools": tools.versions(st.tools),
        "code": code_digest(spec),
    }
    if st.key_extra:
        material["extra"] = st.key_extra(spec.params)
    return material


@lru_cache(maxsize=None)
def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` of this package (``tasks.a.b`` -> ``tasks/a/b.py`` or
    ``tasks/a/b/__init__.py``), found on disk without importing anything; None if there is none
    (e.g. ``tasks.paths.root``, a function)."""
    parts = name.split(".")
    if parts[0] != __name__.split(".")[0]:
        return None
    base = Path(__file__).resolve().parent.joinpath(*parts[1:])
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@lru_cache(maxsize=None)
def direct_imports(name: str) -> frozenset[str]:
    """The modules of this package that module ``name`` imports itself (``import``/``from``
    statements anywhere in its source, functions included; read with ``ast``, nothing
    imported). Empty for a name with no source file. Raises SyntaxError for a module that
    does not parse. The parse is kept in the stat cache under the file's content digest
    (:meth:`tasks.digest.StatCache.derived`), so an unchanged file is parsed once, not by every
    process (a no-op build parsed 30 files: issue 11)."""
    f = _module_file(name)
    if f is None:
        return frozenset()
    is_pkg = f.name == "__init__.py"
    found = json.loads(digest.default_stat_cache().derived(
        f"imports:{name}", digest.file_digest(f), lambda: json.dumps(_import_targets(f, name, is_pkg)),
        reader=Path(__file__)))
    return frozenset(t for t in found if t != name and _module_file(t) is not None)


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
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            out.update([stem] + [f"{stem}.{a.name}" for a in node.names])
    return sorted(out)


@lru_cache(maxsize=None)
def code_modules(name: str) -> tuple[str, ...]:
    """``name`` and every module of this package it imports, directly or through others, at
    any depth and inside functions too (:func:`direct_imports`), and the ``__init__`` of every
    package on the way (it runs when a submodule is imported: module traces showed
    ``tasks.encoder`` loaded in verify's children, tests/test_keys.py): the code a stage runs.
    Sorted dotted names. Raises SyntaxError for a module that does not parse."""
    seen, todo = set(), [name]
    while todo:
        mod = todo.pop()
        if mod in seen or _module_file(mod) is None:
            continue
        seen.add(mod)
        todo.extend(direct_imports(mod))
        todo.extend(mod.rsplit(".", k)[0] for k in range(1, mod.count(".")))  # its parent packages
    return tuple(sorted(seen))


_CODE_FILES: dict[tuple, tuple[tuple, dict[str, str]]] = {}


def _stamp(names) -> tuple:
    out = []
    for n in names:
        st = os.stat(_module_file(n))
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def code_files(spec: StageSpec) -> dict[str, str]:
    """{dotted module name: xxh3 of its source} for the modules :func:`code_digest` covers,
    sorted by name (what a cluster worker compares to name the module that differs). Worked
    out once per process for each stage implementation (and patch steps) and reused while the files'
    stats are unchanged (a plain ``os.stat`` each, no stat-cache query)."""
    k = (spec.impl.module, tuple(s["name"] for s in spec.params["steps"]) if spec.kind == "patch" else ())
    hit = _CODE_FILES.get(k)
    if hit is not None and _stamp(hit[1]) == hit[0]:
        return dict(hit[1])
    files = _code_files(spec)
    _CODE_FILES[k] = (_stamp(files), files)
    return dict(files)


def _code_files(spec: StageSpec) -> dict[str, str]:
    st = spec.impl
    names = set(code_modules(st.module))
    for dep in st.code_deps:  # modules found by name at run time, not imported
        names.update(code_modules(dep))
    if spec.kind == "patch":
        from . import patches

        for s in spec.params["steps"]:
            names.update(code_modules(patches.get(s["name"]).fn.__module__))
    return {n: digest.file_digest(_module_file(n)) for n in sorted(names)}


def code_digest(spec: StageSpec) -> str:
    """xxh3 of the source files that implement ``spec``: every module of this package that its
    stage module imports, at any depth (:func:`code_modules`; the target table, the LLM
    helpers, ...) and, for a patch stage, each step's patch module (patches are found by name,
    not imported). A hand-bumped ``version`` or a hand-kept list of dependencies is easy to
    forget (both went stale here: issue 11); the import graph cannot be forgotten. Keyed by
    dotted module name (``tasks.llm.export`` and ``tasks.encoder.export`` are two files)."""
    return digest.digest_json(code_files(spec))


def stage_key(material: dict) -> str:
    """The stage key: xxh3-128 hex of the canonical JSON of ``material``."""
    return digest.digest_json(material)


class Resolver:
    """Computes keys and finds entries for the stages of one recipe, memoising within a run.

    With a remote cache, ``pull=True`` downloads a stage's remote entry when the local cache
    misses it (what a build does); ``pull`` as a set of stage kinds downloads only those kinds
    (what ``build/<recipe>/`` and the checks read, after a cluster build), the others as with
    ``pull=False``; ``pull=False`` only reads remote manifests (``explain``,
    ``gc``, ``push``): an entry seen there has ``origin="remote"`` and no local files."""

    def __init__(self, recipe_name: str, pull: bool | frozenset = True):
        self.recipe = recipe_name
        self.specs = plan(recipe_name)
        self.cache = cache()
        self.pull = pull
        self._materials: dict[str, dict] = {}
        self._entries: dict[str, Entry] = {}

    def material(self, stage: str) -> dict:
        """Key material of ``stage``. Raises NotReady if an upstream has no entry. While the
        recipe set is pinned (a doit command), stages of different recipes that are the same
        stage (implementation, params, upstream outputs, data files) share one computation."""
        if stage not in self._materials:
            spec = self.specs[stage]
            upstream = {r: self.entry(up) for r, up in spec.inputs.items()}
            same = None
            if _PINNED is not None:
                same = json.dumps([spec.kind, spec.family, spec.params, spec.files,
                                   {r: e.output_digest for r, e in upstream.items()}], sort_keys=True)
                if same in _MATERIALS:
                    self._materials[stage] = _MATERIALS[same]
                    return _MATERIALS[same]
            self._materials[stage] = key_material(spec, upstream)
            if same is not None:
                _MATERIALS[same] = self._materials[stage]
        return self._materials[stage]

    def remember(self, stage: str, material: dict, entry: Entry) -> None:
        """Take ``entry`` (with its key ``material``) as the stage's, e.g. once it is built."""
        self._materials[stage], self._entries[stage] = material, entry

    def key(self, stage: str) -> str:
        return stage_key(self.material(stage))

    def entry(self, stage: str) -> Entry:
        """The committed entry of ``stage`` (checked once per Resolver). Raises NotReady."""
        if stage not in self._entries:
            spec = self.specs[stage]
            key = self.key(stage)
            e = _INTACT.get((spec.kind, key))
            if e is None and (self.pull is True or (self.pull and spec.kind in self.pull)):
                e = self.cache.fetch(spec.kind, key)
            elif e is None:
                e = self.cache.lookup(spec.kind, key) or self.cache.peek_remote(spec.kind, key)
            if e is not None and _PINNED is not None and e.origin == "local":  # "pulled" is this lookup's news
                _INTACT[(spec.kind, key)] = e
            if e is None:
                raise NotReady(f"waits for {spec.task}, which has no cache entry yet")
            self._entries[stage] = e
        return self._entries[stage]

    def failures(self, stage: str, entry: Entry) -> list[str]:
        spec = self.specs[stage]
        check = spec.impl.check
        return check(entry.out, entry.manifest, spec.params) if check else []


def line(task: str, key: str, status: str, seconds: float, width: int = 0) -> str:
    """The console's one line for a stage: task, key prefix, built / cache hit / pulled (from
    the remote cache) / FAILED / stopped (Ctrl-C), seconds."""
    return f"{task:<{width}}  {key[:12]}  {status:<9}  {seconds:6.1f}s"


def task_width(recipe_name: str) -> int:
    """Width of the longest stage task name of a recipe, to align its console lines."""
    return max(len(s.task) for s in plan(recipe_name).values())


def failed_log_path(recipe_name: str, stage: str) -> Path:
    """Where the log of a stage's last failed build is kept (its temp folder is removed)."""
    return paths.state_dir() / "logs" / recipe_name / f"{stage}.failed.txt"


# {task name: (key, seconds)} of the stages is_up_to_date found cached in this process (for
# the console line of a skipped task: tasks.dodo_tasks.Reporter)
CHECKED: dict[str, tuple[str, float, str]] = {}  # task -> (key, seconds, 'cache hit' | 'pulled')


def build_spec(spec: StageSpec, upstream: dict[str, Entry], cache: Cache,
               material: dict | None = None, kept_log: Path | None = None) -> tuple[str, dict, Entry, bool]:
    """Build (or reuse: local hit, else remote pull) the cache entry of ``spec`` in ``cache``,
    from its committed upstream entries (by role). The stage's output goes to ``log.txt`` in
    its entry (``tasks/stagelog.py``); when the build fails and ``kept_log`` is given, the log
    is copied there and the exception gets a note naming it. Returns (key, key material,
    entry, built). Knows nothing of recipes or of doit: ``run_stage`` and cluster workers
    (tasks/cluster.py) both call it. Checks nothing about the result (that is
    :meth:`Resolver.failures`)."""
    import shutil
    import tempfile

    from . import stagelog
    from .proc import child, heap

    st = spec.impl
    material = material or key_material(spec, upstream)
    key = stage_key(material)
    files = {role: project_file(rel) for role, rel in spec.files.items()}

    def build(out: Path) -> dict:
        log = out.parent / stagelog.LOG_NAME
        tracing = bool(os.environ.get(child.TRACE_ENV))
        before = set(sys.modules) if tracing else set()
        if tracing:  # the modules this stage loads, here and in its children (tests/test_keys.py)
            os.environ[child.TRACE_STAGE_ENV] = spec.task
        try:
            heap.keep_freed(heap.input_bytes(upstream) <= heap.KEEP_INPUT_MAX)
            with stagelog.capture(log, spec.task):
                print(f"{spec.task}: {spec.kind} {key} (recipe {spec.recipe}), {time.strftime('%Y-%m-%d %H:%M:%S')}",
                      flush=True)
                # the stage reads copies of its data files, checked against the key (issue 23)
                read = digest.snapshot(files, material["files"], spec.files, Path(tempfile.mkdtemp(prefix="inputs-")))
                rss.peak_rss_reset()  # this process's peak from here: the stage's own (children report theirs)
                try:
                    info = st.run({r: e.out for r, e in upstream.items()}, read, spec.params, out) or {}
                except ValueError as e:  # a data file's problem names the file the recipe names, not the copy
                    if e.args and isinstance(e.args[0], str):
                        msg = e.args[0]
                        for role, copy in read.items():
                            msg = msg.replace(str(copy), spec.files[role])
                        e.args = (msg, *e.args[1:])
                    raise
                if (peak := rss.peak_rss()) is not None:
                    info = {**info, "stage_peak_rss": peak}
                if check := st.check_read:  # e.g. a source folder's copy vs its key
                    check(out, material, spec.params)
                return info
        except BaseException as e:
            if kept_log is not None and log.exists():
                try:
                    kept_log.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(log, kept_log)
                    e.add_note(f"log: {kept_log}")
                except OSError as copy_error:  # a full or read-only home: the stage's own error stays the news
                    kept_log.unlink(missing_ok=True)
                    e.add_note(f"log: not kept at {kept_log} ({os.strerror(copy_error.errno or 0)})")
            raise
        finally:
            if tracing:
                os.environ.pop(child.TRACE_STAGE_ENV, None)
                child.write_trace("stage", set(sys.modules) - before, spec.task)

    base = {
        "material": material,  # lets a remote reader check that the entry is this key's
        "stage_version": st.version, "code": material["code"], "params": spec.params, "tools": material["tools"],
        "inputs": {r: {"kind": e.kind, "key": e.key, "output_digest": e.output_digest} for r, e in upstream.items()},
        "files": {r: {"path": spec.files[r], "xxh3": material["files"][r]} for r in files},
        "extra": material.get("extra", {}), "host": tools.host(), "built_for": spec.recipe,
        "builder": tools.builder(),
    }
    entry, built = cache.get_or_build(spec.kind, key, base, build)
    return key, material, entry, built


def run_stage(recipe_name: str, stage: str) -> dict:
    """Build (or reuse) the cache entry of one stage; the action of its doit task.

    The console gets one line (:func:`line`); a failed build's log is kept at
    :func:`failed_log_path`. Returns {"key", "built"} (doit saves it as the task's values).
    Raises StageFailed when the stage's ``check`` rejects the result (e.g. verify below a
    threshold); the entry itself stays, since the measurement is valid and deterministic.
    """
    from . import stagelog

    res = Resolver(recipe_name)
    spec = res.specs[stage]
    upstream = {role: res.entry(up) for role, up in spec.inputs.items()}
    material = res.material(stage)
    key = stage_key(material)
    width = task_width(recipe_name)
    kept = failed_log_path(recipe_name, stage)
    t0 = time.time()
    try:
        key, material, entry, built = build_spec(spec, upstream, res.cache, material, kept)
    except BaseException as e:
        # stopped also when a library turned the Ctrl-C into another error (tasks/proc/interrupt.py)
        stopped = isinstance(e, KeyboardInterrupt) or interrupt.seen()
        print(line(spec.task, key, "stopped" if stopped else "FAILED", time.time() - t0, width), flush=True)
        if stopped and not isinstance(e, KeyboardInterrupt):
            ki = KeyboardInterrupt()
            for note in getattr(e, "__notes__", ()):  # the kept log's path (build_spec)
                ki.add_note(note)
            raise ki from e
        if not stopped and (bad := _names_entry(e, upstream)):
            up = next(res.specs[n].task for r, n in spec.inputs.items() if upstream[r] is bad)
            first = " ".join(ln.strip() for ln in str(e).splitlines() if ln.strip())
            err = UpstreamUnusable(f"upstream entry {bad.kind}/{bad.key} ({bad.path}), built by {up}, cannot be "
                                   f"used [{type(e).__name__}: {first}]: drop it (`rm -rf {bad.path}`) and build "
                                   f"again; {up} rebuilds it")
            for note in getattr(e, "__notes__", ()):
                err.add_note(note)
            raise err from None
        raise
    kept.unlink(missing_ok=True)
    record(recipe_name, stage, key, material, entry)
    for (_, name), checking in _CHECKING.items():  # later up-to-date checks of this process see it
        if name == recipe_name and checking.specs.get(stage) == spec:
            checking.remember(stage, material, entry)
    bad = res.failures(stage, entry)
    status = "FAILED" if bad else "built" if built else "pulled" if entry.origin == "pulled" else "cache hit"
    print(line(spec.task, key, status, time.time() - t0, width), flush=True)
    if interrupt.seen():  # a library swallowed the Ctrl-C and the stage finished (its entry is whole): stop here
        raise KeyboardInterrupt()
    if bad:
        raise StageFailed(f"{spec.task} failed:\n  " + "\n  ".join(bad) + f"\n  (details: {entry.out})"
                          f"\n  log: {entry.path / stagelog.LOG_NAME}")
    return {"key": key, "built": built}


def memory_estimate(recipe_name: str, stage: str) -> int:
    """Estimated peak bytes of one stage of a recipe, before anything is built: for LLMs from
    the source's config.json and the recipe's export shape (``tasks/llm/memory.py``), else a
    small constant. What a cluster build asks of a worker's ``MEMORY`` resource."""
    from .llm import memory

    return memory.plan_estimate(plan(recipe_name), stage)


_CHECKING: dict[tuple[int, str], "Resolver"] = {}


def checking_resolver(recipe_name: str) -> "Resolver":
    """The process's Resolver for up-to-date checks of ``recipe_name``: keys, entries and
    entry checks are worked out once per process, not once per task (a no-op build over 50
    recipes computed key material 1,350 times for 300 stages: issue 11). Only found entries
    are memoised, so a stage built later in the process is seen (:func:`run_stage` also
    tells it). Tied to the loaded recipe set: a recipe edited during a run gets a new one."""
    k = (id(_load()), recipe_name)
    if k not in _CHECKING:
        _CHECKING[k] = Resolver(recipe_name)
        _CHECKING[k].cache.defer_rejections = True  # the stage that then runs says it (tasks/cache.py)
    return _CHECKING[k]


def is_up_to_date(recipe_name: str, stage: str) -> bool:
    """True when the stage's key can be computed and names an intact entry that passes its
    check. Used as the doit ``uptodate`` callable (evaluated after upstream tasks ran)."""
    t0 = time.time()
    try:
        res = checking_resolver(recipe_name)
        e = res.entry(stage)
    except Exception:  # not built, or the key cannot be computed (e.g. a missing source, a stat
        return False  # cache that cannot be written): the action then runs and reports the error cleanly
    if res.failures(stage, e):
        return False
    record(recipe_name, stage, e.key, res.material(stage), e)
    CHECKED[res.specs[stage].task] = (e.key, time.time() - t0, "pulled" if e.origin == "pulled" else "cache hit")
    return True


# ------------------------------------------------------------ build/<recipe>/ state


def state_path(recipe_name: str) -> Path:
    return paths.build_dir() / recipe_name / "stages.json"


def read_state(recipe_name: str, fresh: bool = False) -> dict:
    """``build/<recipe>/stages.json`` ({} when absent). One that cannot be read is reported in
    one line and counts as empty; the next stage of the recipe that runs rewrites it. While the
    recipe set is pinned, read once per command (``fresh``: from the file; the result may then
    be changed), else the caller must not change it."""
    if _PINNED is not None and recipe_name in _STATES and not fresh:
        return _STATES[recipe_name]
    p = state_path(recipe_name)
    try:
        st = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(st, dict):
            if _PINNED is not None and not fresh:
                _STATES[recipe_name] = st
            return st
        err = f"expected a JSON object, found {type(st).__name__}"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        err = f"{type(e).__name__}: {e}"
    print(f"npubuild: {p}: unreadable ({err}); ignored, rewritten by the next build of {recipe_name}",
          file=sys.stderr)
    return {}


def record(recipe_name: str, stage: str, key: str, material: dict, entry: Entry) -> None:
    """Remember the last key and key material of a stage of this recipe (for explain).
    Writes nothing when ``stages.json`` already says so (a no-op build writes no state)."""
    from filelock import FileLock

    from . import outputs

    row = json.loads(json.dumps({"key": key, "kind": entry.kind, "entry": str(entry.path), "material": material}))
    if read_state(recipe_name).get(stage) == row:
        return
    p = state_path(recipe_name)
    p.parent.mkdir(parents=True, exist_ok=True)
    locks = paths.state_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(str(locks / f"state-{recipe_name}.lock")):
        # rows of stages the recipe no longer has (a part removed) go: explain has nothing to
        # say of them, and gc would keep their entries as the last build's (a tester)
        names = plan(recipe_name)
        st = {k: v for k, v in read_state(recipe_name, fresh=True).items() if k in names}
        st[stage] = row
        # a temp file and one rename (a dead build's temp file is removed with its temp links); a
        # full disk is one DiskFull line and leaves the file as it was
        outputs.write_text(p, json.dumps(st, indent=2, sort_keys=True) + "\n", "NPUBUILD_BUILD")
        _STATES.pop(recipe_name, None)
