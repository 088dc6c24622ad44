"""``doit explain:<recipe>``: each stage's key, status, log and what changed since the
recipe's last build, from :func:`tasks.core.state.build_state`."""

from __future__ import annotations

import json
import sys

from tasks.store import remote
from tasks.store.stagelog import LOG_NAME
from tasks.core import recipeset
from tasks.core.resolve import Resolver
from tasks.core.run import failed_log_path
from tasks.core.session import Session
from tasks.core.record import read_state
from tasks.core.state import build_state, diff


def _named(change: str, files: dict) -> str:
    """A change of a data file's digest, with the file's path: ``files.calibration
    (recipes/data/calib-en.txt): content "..." -> "..."``."""
    role, sep, rest = change.partition(": ")
    if sep and role.startswith("files.") and role[6:] in files:
        return f"{role} ({files[role[6:]]}): content {rest}"
    return change


def explain(session: Session, recipe_name: str) -> list[dict]:
    """For each stage (:func:`build_state` with a Resolver that downloads nothing): name, task,
    kind, implementation, params, inputs, files, key (or None), status (``state.STATUSES``),
    its log (the local entry's ``log.txt``, or the last failed or stopped build's), for a
    failed one the check's findings (``fails``), and, for a stale stage,
    what changed in its key material since the recipe's last build; for a blocked or unknown
    one, why; for a built verify, how each runtime the bundle serves was checked
    (``runtimes``: :func:`tasks.contract.report.runtimes_checked`), for a built stage what
    its manifest records of its memory (``memory``: the estimate checked before work and the
    process tree's measured peak, :func:`tasks.proc.budget.manifest_memory`). Raises KeyError for a
    recipe that is not in the session's recipe set."""
    res = Resolver(session, recipe_name, pull=False)
    last = read_state(session, recipe_name)
    rows = []
    for name, st in build_state(res, last).stages.items():
        spec = st.spec
        row = {
            "stage": name,
            "task": spec.task,
            "kind": spec.kind,
            "impl": spec.impl.module,
            "params": spec.params,
            "inputs": spec.inputs,
            "files": spec.files,
            "key": st.key,
            "status": st.status,
        }
        e = st.entry
        if e and (e.path / LOG_NAME).is_file():
            row["log"] = str(e.path / LOG_NAME)
        elif not e and st.key and failed_log_path(recipe_name, name).is_file():
            row["log"] = f"{failed_log_path(recipe_name, name)} (last failed or stopped build)"
        if st.status == "stale":
            row["changes"] = [_named(c, spec.files) for c in diff(last[name]["material"], st.material)] or [
                f"nothing in its key: the entry {spec.kind}/{st.key[:12]} the last build made or used is gone "
                "from the cache (deleted, `doit gc --apply`, or damaged and moved to .damaged/)"
            ]
        elif st.status in ("blocked", "unknown"):
            # a key that cannot be computed (an offline Hub source) fails the same way for every
            # stage after it: said once, at the first, and the others point there
            first = next((r["task"] for r in rows if r["status"] == "unknown" and r["changes"] == [st.problem]), None)
            row["changes"] = [f"its key waits for {first}'s (above)" if first else st.problem]
        if st.failures:
            row["fails"] = list(st.failures)
        if e and isinstance((e.manifest.get("info") or {}).get("memory"), dict):
            row["memory"] = e.manifest["info"]["memory"]
        if e and spec.kind == "verify" and (e.out / "verify.json").is_file():
            from tasks.contract.report import runtimes_checked

            row["runtimes"] = runtimes_checked(json.loads((e.out / "verify.json").read_text(encoding="utf-8")))
        rows.append(row)
    return rows


def memory_line(mem: dict) -> str:
    """A built stage's memory as ``doit explain`` prints it: the process tree's measured peak
    against the estimate checked before work (with what the stage's process held already, and
    the budget when one was known): ``memory: peak 2.31 GiB (process tree), estimate 2.62 GiB
    (0.40 held), budget 4.00 GiB``; "over its estimate" when the peak is above it."""

    def gib(b):
        return "unknown" if b is None else f"{b / (1 << 30):.2f} GiB"

    est, peak = mem.get("estimate"), mem.get("peak")
    line = f"memory: peak {gib(peak)} (process tree), estimate {gib(est)}"
    if mem.get("held"):
        line += f" ({mem['held'] / (1 << 30):.2f} held)"
    if mem.get("budget") is not None:
        line += f", budget {gib(mem['budget'])}"
    if est is not None and peak is not None and peak > est:
        line += f": over its estimate by {gib(peak - est)}"
    return line


def print_explain(session: Session, recipe_name: str, verbose: bool = True) -> None:
    """Print :func:`explain`'s rows, then the recipe's plan figures, the remote cache and the
    memory budget. Raises KeyError for an unknown recipe."""
    for row in explain(session, recipe_name):
        key = row["key"][:16] if row["key"] else "-" * 16
        print(f"{row['task']:<40} {row['kind']:<9} {key}  {row['status']}")
        if verbose:
            print(f"    impl: {row['impl']}  params: {json.dumps(row['params'], sort_keys=True)}")
            if row["inputs"] or row["files"]:
                print(f"    inputs: {json.dumps(row['inputs'])} files: {json.dumps(row['files'])}")
        if row.get("log"):
            print(f"    log: {row['log']}")
        if mem := row.get("memory"):
            print(f"    {memory_line(mem)}")
        for c in row.get("changes", []):
            print(f"    changed: {c}")
        for f in row.get("fails", []):
            print(f"    fails: {f}")
        for rt, how in row.get("runtimes", {}).items():
            print(f"    serves {rt}: {how}")
    from tasks.contract import family

    recipe = recipeset.recipes(session)[recipe_name]
    for line in (family(recipe.export.family).plan_lines or (lambda _: []))(recipe):
        print(f"    {line}")
    r = remote.from_env()
    print(f"    remote cache: {r.display if r else 'none (NPUBUILD_REMOTE unset)'}")
    from tasks.proc.budget import budget_line

    print(f"    memory budget: {budget_line()}")
    sys.stdout.flush()
