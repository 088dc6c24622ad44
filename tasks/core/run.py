"""Running one stage through the cache (:func:`build_spec`; :func:`run_stage`, the action of
its doit task, with the console's one line), and the up-to-date check of a stage task."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tasks import tools
from tasks.store import digest
from tasks.store import paths
from tasks.store.entries import Cache
from tasks.store.entry import Entry
from tasks.errors import UserError
from tasks.proc import interrupt
from tasks.core import recipeset
from tasks.core.admit import estimate_or_none
from tasks.core.keys import key_material, project_file, stage_key
from tasks.core.resolve import Resolver, checking_resolver
from tasks.core.session import Session
from tasks.core.record import record


class StageFailed(UserError):
    """A stage ran and its result does not pass its recipe's check (e.g. verify below a
    threshold): the message lists each failed check and where the details are."""


class UpstreamUnusable(UserError):
    """A stage failed reading the files of an upstream cache entry (the error names a path in
    it): the message names the entry and how to drop it, so the next build rebuilds it."""


def _names_entry(err: BaseException, upstream: dict[str, Entry]) -> Entry | None:
    """The entry of ``upstream`` whose folder ``err``, or an error it was raised from, names
    (its message or its ``filename``), when ``err`` is not one of ours (``tasks.*``: those
    say what is wrong themselves) and not an interrupt, a full disk or a ``ValueError`` other
    than an OSError (a recipe's value the entry does not fit: rebuilding it would not help)."""
    from tasks.store.fileops import is_disk_full

    if isinstance(err, KeyboardInterrupt) or is_disk_full(err) or type(err).__module__.startswith("tasks."):
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


def line(task: str, key: str, status: str, seconds: float, width: int = 0) -> str:
    """The console's one line for a stage: task, key prefix, built / cache hit / pulled (from
    the remote cache) / FAILED / stopped (Ctrl-C), seconds."""
    return f"{task:<{width}}  {key[:12]}  {status:<9}  {seconds:6.1f}s"


def task_width(session: Session, recipe_name: str) -> int:
    """Width of the longest stage task name of a recipe, to align its console lines. Raises
    KeyError for an unknown recipe."""
    return max(len(s.task) for s in recipeset.plan(session, recipe_name).values())


def failed_log_path(recipe_name: str, stage: str) -> Path:
    """Where the log of a stage's last failed build is kept (its temp folder is removed)."""
    return paths.state_dir() / "logs" / recipe_name / f"{stage}.failed.txt"


def build_spec(
    session: Session,
    spec,
    upstream: dict[str, Entry],
    cache: Cache,
    material: dict | None = None,
    kept_log: Path | None = None,
    estimate: int | None = None,
) -> tuple[str, dict, Entry, bool]:
    """Build (or reuse: local hit, else remote pull) the cache entry of ``spec`` (a
    :class:`tasks.recipe.plan.StageSpec`) in ``cache``, from its committed upstream entries (by
    role); ``material``: its key material when already known. The stage's output goes to
    ``log.txt`` in its entry (``tasks/store/stagelog.py``); when the build fails and ``kept_log`` is
    given, the log is copied there and the exception gets a note naming it. ``estimate``: the
    stage's estimated peak bytes in a fresh process (:func:`memory_estimate`), checked against
    the memory budget before work with what this process holds already (:func:`tasks.proc.budget.check`;
    a stage may check a finer figure of its own after it). The manifest's ``info["memory"]``
    records the last figure checked, what was held, the budget, and the stage's measured process
    tree peak (:mod:`tasks.proc.tree`); the log gets both. Returns (key, key
    material, entry, built). Knows nothing of recipes or of doit: :func:`run_stage` and
    cluster workers (tasks/commands/cluster/build.py) both call it. Checks nothing about the result (that is
    :meth:`tasks.core.resolve.Resolver.failures`). Raises what the stage raises, and what
    ``Cache.get_or_build`` raises (LockTimeout, DiskFull, ...)."""
    import shutil
    import tempfile

    from tasks.store import stagelog
    from tasks.proc import budget, child, heap, tree

    st = spec.impl
    material = material or key_material(session, spec, upstream)
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
                print(
                    f"{spec.task}: {spec.kind} {key} (recipe {spec.recipe}), {time.strftime('%Y-%m-%d %H:%M:%S')}",
                    flush=True,
                )
                # the stage reads copies of its data files, checked against the key
                read = digest.snapshot(files, material["files"], spec.files, Path(tempfile.mkdtemp(prefix="inputs-")))
                budget.checked_reset()
                if estimate is not None:  # before work; the stage may check a finer figure of its own
                    budget.check(spec.name, estimate, spec.part, recipe_keys=None, held=budget.held_bytes(False))
                meter = tree.measure()  # this process's peak from here: the stage's own, and its children's
                try:
                    info = st.run({r: e.out for r, e in upstream.items()}, read, spec.params, out) or {}
                except ValueError as e:  # a data file's problem names the file the recipe names, not the copy
                    if e.args and isinstance(e.args[0], str):
                        msg = e.args[0]
                        for role, copy in read.items():
                            msg = msg.replace(str(copy), spec.files[role])
                        e.args = (msg, *e.args[1:])
                    raise
                info = {**info, **budget.manifest_memory(meter.figures())}
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
        "stage_version": st.version,
        "code": material["code"],
        "params": spec.params,
        "tools": material["tools"],
        "inputs": {r: {"kind": e.kind, "key": e.key, "output_digest": e.output_digest} for r, e in upstream.items()},
        "files": {r: {"path": spec.files[r], "xxh3": material["files"][r]} for r in files},
        "extra": material.get("extra", {}),
        "host": tools.host(),
        "built_for": spec.recipe,
        "builder": tools.builder(),
    }
    entry, built = cache.get_or_build(spec.kind, key, base, build)
    return key, material, entry, built


def run_stage(session: Session, recipe_name: str, stage: str) -> dict:
    """Build (or reuse) the cache entry of one stage; the action of its doit task.

    The console gets one line (:func:`line`); a failed build's log is kept at
    :func:`failed_log_path`. Returns {"key", "built"} (doit saves it as the task's values).
    Raises StageFailed when the stage's ``check`` rejects the result (e.g. verify below a
    threshold); the entry itself stays, since the measurement is valid and deterministic.
    Raises UpstreamUnusable when the stage failed reading an upstream entry's files,
    KeyboardInterrupt when stopped, else what :func:`build_spec` raises.
    """
    from tasks.store import stagelog

    res = Resolver(session, recipe_name)
    spec = res.specs[stage]
    upstream = {role: res.entry(up) for role, up in spec.inputs.items()}
    material = res.material(stage)
    key = stage_key(material)
    width = task_width(session, recipe_name)
    kept = failed_log_path(recipe_name, stage)
    t0 = time.time()
    try:
        key, material, entry, built = build_spec(
            session,
            spec,
            upstream,
            res.cache,
            material,
            kept,
            estimate_or_none(session, recipe_name, stage, memory_estimate),
        )
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
            err = UpstreamUnusable(
                f"upstream entry {bad.kind}/{bad.key} ({bad.path}), built by {up}, cannot be "
                f"used [{type(e).__name__}: {first}]: drop it (`rm -rf {bad.path}`) and build "
                f"again; {up} rebuilds it"
            )
            for note in getattr(e, "__notes__", ()):
                err.add_note(note)
            raise err from None
        raise
    kept.unlink(missing_ok=True)
    record(session, recipe_name, stage, key, material, entry, res.specs)
    for (_, name), checking in session.checking.items():  # later up-to-date checks of this session see it
        if name == recipe_name and checking.specs.get(stage) == spec:
            checking.remember(stage, material, entry)
    bad = res.failures(stage, entry)
    status = "FAILED" if bad else "built" if built else "pulled" if entry.origin == "pulled" else "cache hit"
    print(line(spec.task, key, status, time.time() - t0, width), flush=True)
    if interrupt.seen():  # a library swallowed the Ctrl-C and the stage finished (its entry is whole): stop here
        raise KeyboardInterrupt()
    if bad:
        raise StageFailed(
            f"{spec.task} failed:\n  " + "\n  ".join(bad) + f"\n  (details: {entry.out})"
            f"\n  log: {entry.path / stagelog.LOG_NAME}"
        )
    return {"key": key, "built": built}


def is_up_to_date(session: Session, recipe_name: str, stage: str) -> bool:
    """True when the stage's key can be computed and names an intact entry that passes its
    check; then the stage is recorded (``stages.json``) and its console line's figures go to
    ``session.checked``. Used as the doit ``uptodate`` callable (evaluated after upstream
    tasks ran). A key that cannot be computed, or an entry not found, is False; raises what
    :func:`tasks.core.record.record` raises (DiskFull)."""
    t0 = time.time()
    try:
        res = checking_resolver(session, recipe_name)
        e = res.entry(stage)
    except Exception:  # not built, or the key cannot be computed (e.g. a missing source, a stat
        return False  # cache that cannot be written): the action then runs and reports the error cleanly
    if res.failures(stage, e):
        return False
    record(session, recipe_name, stage, e.key, res.material(stage), e, res.specs)
    session.checked[res.specs[stage].task] = (
        e.key,
        time.time() - t0,
        "pulled" if e.origin == "pulled" else "cache hit",
    )
    return True


def memory_estimate(session: Session, recipe_name: str, stage: str) -> int:
    """Estimated peak bytes of one stage of a recipe, before anything is built: what its
    implementation's ``memory_estimate`` hook says (:class:`tasks.contract.stage.Stage`), else
    its family's (:class:`tasks.contract.model_family.Family`: the shared download and patch),
    else :data:`tasks.proc.budget.DEFAULT_STAGE_BYTES`. What a cluster build asks of a worker's
    ``MEMORY`` resource. Raises what the hook raises (e.g. an LLM whose config.json is not at
    hand)."""
    from tasks.contract import family
    from tasks.proc.budget import DEFAULT_STAGE_BYTES

    specs = recipeset.plan(session, recipe_name)
    spec = specs[stage]
    hook = spec.impl.memory_estimate or family(spec.family).memory_estimate
    return hook(specs, stage) if hook else DEFAULT_STAGE_BYTES
