"""Cluster builds on Dask: ``doit cluster --scheduler tcp://host:8786 [recipe ...]``.

The client (the machine that runs the command) plans the chosen recipes, finds the stages
that neither the local nor the remote cache (``NPUBUILD_REMOTE``, required) has, and submits
each such stage as one Dask task that depends on the tasks of its upstream stages. A stage's
key needs its upstreams' output digests, so the worker computes it when it runs: it gets the
stage spec, the (kind, key, output digest) of each upstream and the client's expected key
material (tool versions, code digest per module, data-file digests, ...); it refuses the stage,
naming the difference, when its own differ (its outputs would have other keys); else it pulls
the upstream entries from the remote, builds the stage into its own local cache with
:func:`tasks.core.run.build_spec` (the code a local build runs) and makes sure the entry is on
the remote (files first, ``manifest.json`` last: a worker killed mid-push leaves no visible
entry, and Dask reruns its task elsewhere). The client then pulls what ``build/<recipe>/``
needs through the normal remote pull, applies the stages' checks (verify thresholds) and
links the artifacts: it builds nothing itself.

Stages that several recipes share are submitted once (one Dask task per distinct stage: the
task's identity is the key material with each pending upstream replaced by its task's
identity). Every task asks for the Dask resource ``MEMORY`` (bytes) sized from the stage's
estimate (:func:`tasks.core.run.memory_estimate`), so workers must be started with
``dask worker ... --resources MEMORY=<bytes>``; a stage no worker can hold is reported
before anything is submitted.

This module knows no stage kind: it plans with ``tasks.core`` and builds specs. The client's
calls share the command's :class:`tasks.core.session.Session`; a worker makes one per stage.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from types import SimpleNamespace

from tasks.store import remote
from tasks.core import keys, recipeset, resolve
from tasks.core.record import record
from tasks.core.admit import estimate_or_none
from tasks.core.run import build_spec, memory_estimate
from tasks.core.session import Session
from tasks.errors import UserError
from tasks.contract import kinds

ENV_SCHEDULER = "NPUBUILD_SCHEDULER"
RESOURCE = "MEMORY"
# key-material fields a worker must agree on with the client (all but "inputs", which are
# the upstream output digests and come with the task)
COMPARED = ("kind", "impl", "version", "params", "files", "tools", "code", "extra")

NO_REMOTE = (
    "a cluster build needs a remote cache: set NPUBUILD_REMOTE to an fsspec URL that this "
    "machine and every worker can reach (file:///shared/folder, s3://bucket/prefix, ...); "
    "workers push what they build there and this machine pulls it (docs/environment.md: Cluster builds)"
)


class ClusterError(UserError):
    """A cluster build could not run or did not finish; the message says why."""


class Refused(UserError):
    """A worker whose tool versions, code or data files differ from the client's refuses a
    stage (its outputs would have other keys); the message names the difference."""


# ------------------------------------------------------------ the worker side


def _worker_name() -> str:
    try:
        from distributed import get_worker

        w = get_worker()
        return f"{w.name} ({w.address})" if w.name is not None and str(w.name) != w.address else w.address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def _differences(session: Session, spec, expected: dict, mine: dict) -> list[str]:
    """What differs between the client's expected key material and this process's (one line
    each; [] when nothing does)."""
    want = expected["material"]
    out = []
    if want.get("tools") != mine.get("tools"):
        a, b = want.get("tools") or {}, mine.get("tools") or {}
        out.append(
            "tool versions differ: "
            + ", ".join(
                f"{n} {a.get(n, 'absent')} (client) vs {b.get(n, 'absent')} (worker)"
                for n in sorted(set(a) | set(b))
                if a.get(n) != b.get(n)
            )
        )
    if want.get("code") != mine.get("code"):
        a, b = expected.get("modules") or {}, keys.code_files(session, spec)
        out.append(
            f"code digest differs: {want.get('code')} (client) vs {mine.get('code')} (worker); modules: "
            + ", ".join(
                f"{n} {a.get(n, 'absent')} (client) vs {b.get(n, 'absent')} (worker)"
                for n in sorted(set(a) | set(b))
                if a.get(n) != b.get(n)
            )
        )
    for k in COMPARED:
        if k not in ("tools", "code") and want.get(k) != mine.get(k):
            out.append(
                f"{k} differs: {json.dumps(want.get(k), sort_keys=True)} (client) vs "
                f"{json.dumps(mine.get(k), sort_keys=True)} (worker)"
            )
    return out


def build_on_worker(spec, upstream: dict, expected: dict) -> dict:
    """The Dask task of one stage: build ``spec`` into this worker's local cache and make sure
    the entry is on the remote. ``upstream``: {role: {"kind", "key", "output_digest"}} (the
    results of the upstream tasks); ``expected``: the client's key material without inputs
    (``material``) and code digest per module (``modules``). Returns {"kind", "key",
    "output_digest", "built", "origin", "worker", "pid", "seconds"}. Raises Refused (this
    worker's tools or code differ) or ClusterError (no remote, upstream missing)."""
    session = Session()  # this stage's: a long-lived worker sees edits to recipes and code
    who = _worker_name()
    remote._remote.cache_clear()  # a fresh Remote per task: one network error does not stick to the worker
    r = remote.from_env()
    if r is None:
        raise ClusterError(f"worker {who}: NPUBUILD_REMOTE is unset on this worker; {NO_REMOTE}")
    pending = {role: SimpleNamespace(output_digest=u["output_digest"]) for role, u in upstream.items()}
    material = keys.key_material(session, spec, pending)
    diffs = _differences(session, spec, expected, material)
    if diffs:
        raise Refused(
            f"worker {who} refuses {spec.task} ({spec.kind}): its outputs would have other keys; " + "; ".join(diffs)
        )
    cache = resolve.cache(session)
    entries = {}
    for role, u in upstream.items():
        e = cache.fetch(u["kind"], u["key"])
        if e is None or e.output_digest != u["output_digest"]:
            raise ClusterError(
                f"worker {who}: upstream {u['kind']}/{u['key']} of {spec.task} is neither in "
                f"this worker's cache nor on the remote {r.display}"
            )
        entries[role] = e
    t0 = time.time()
    print(
        f"[{spec.task}] building {spec.kind} {keys.stage_key(material)[:12]}", flush=True
    )  # begun (a kill test reads it)
    key, material, entry, built = build_spec(
        session,
        spec,
        entries,
        cache,
        material,
        estimate=estimate_or_none(session, spec.recipe, spec.name, memory_estimate),
    )
    if r.read_manifest(spec.kind, key) is None:  # its push failed (warned), or an older local entry
        cache.push(spec.kind, key, material)  # raises RemoteError: the client could not pull it
    print(
        f"npubuild-cluster: {spec.kind}/{key} {'built' if built else 'reused (' + entry.origin + ')'} "
        f"for {spec.task} on {who}",
        flush=True,
    )
    return {
        "kind": spec.kind,
        "key": key,
        "output_digest": entry.output_digest,
        "built": built,
        "origin": entry.origin,
        "worker": who,
        "pid": os.getpid(),
        "seconds": round(time.time() - t0, 3),
    }


# ------------------------------------------------------------ the client side


def _workers(client) -> dict:
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:
        info = client.scheduler_info()
    return info.get("workers", {})


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _memory(session: Session, recipe: str, stage: str, spec) -> int:
    try:
        return int(memory_estimate(session, recipe, stage))
    except Exception as e:  # e.g. an LLM whose config.json is neither local nor in the Hub cache
        raise ClusterError(
            f"{spec.task}: cannot estimate its memory, which sizes its {RESOURCE} request ({type(e).__name__}: {e})"
        ) from None


def plan(session: Session, recipes: list[str], log=print) -> tuple[dict, dict, dict]:
    """The stages of ``recipes`` to build on the cluster, nothing submitted. Returns
    (nodes, done, stage_node): ``nodes`` {task id: {"spec", "ups" {role: task id}, "expected",
    "memory", "tasks" [doit task names]}} in build order, ``done`` {task id: result} for stages
    whose entry is on the remote already (a local-only entry is pushed first), and
    ``stage_node`` {(recipe, stage): task id}. A task id is the stage key when every upstream
    is done, else the key material's digest with each pending upstream's task id. Raises
    ClusterError (a local entry that cannot be pushed, a memory estimate that fails)."""
    cache = resolve.cache(session)
    nodes, done, stage_node = {}, {}, {}
    for recipe in recipes:
        specs = recipeset.plan(session, recipe)
        for name, spec in specs.items():
            ups = {role: stage_node[(recipe, up)] for role, up in spec.inputs.items()}
            pend = {
                role: SimpleNamespace(output_digest=done[n]["output_digest"] if n in done else f"pending:{n}")
                for role, n in ups.items()
            }
            material = keys.key_material(session, spec, pend)
            nid = keys.stage_key(material)
            stage_node[(recipe, name)] = nid
            if nid in nodes:
                nodes[nid]["tasks"].append(spec.task)
                continue
            if nid in done:
                continue
            if all(n in done for n in ups.values()):  # the key is known: is the entry anywhere?
                e = cache.lookup(spec.kind, nid)
                if e is not None:
                    try:
                        pushed = cache.push(spec.kind, nid, material=material)
                    except (remote.Rejected, remote.RemoteError) as err:
                        raise ClusterError(
                            f"{spec.task}: cannot push the local entry {spec.kind}/{nid} that workers need: {err}"
                        ) from None
                    if pushed:
                        log(f"[cluster] {spec.task} {spec.kind}/{nid[:12]} pushed from the local cache")
                    done[nid] = {"kind": spec.kind, "key": nid, "output_digest": e.output_digest, "origin": "local"}
                    continue
                e = cache.peek_remote(spec.kind, nid)
                if e is not None:
                    done[nid] = {"kind": spec.kind, "key": nid, "output_digest": e.output_digest, "origin": "remote"}
                    continue
            nodes[nid] = {
                "spec": spec,
                "ups": ups,
                "tasks": [spec.task],
                "expected": {
                    "material": {k: material.get(k) for k in COMPARED},
                    "modules": keys.code_files(session, spec),
                },
                "memory": _memory(session, recipe, name, spec),
            }
    return nodes, done, stage_node


def build(
    recipes: list[str] | None,
    scheduler: str | None,
    link=None,
    log=print,
    timeout: float | None = None,
    session: Session | None = None,
) -> dict:
    """Build the stale stages of ``recipes`` (default: every valid, non-abstract recipe) on
    the Dask cluster at ``scheduler`` (default ``$NPUBUILD_SCHEDULER``), then pull their
    entries that ``build/<recipe>/`` and the checks read (not, e.g., a download or a quantize
    entry) and call ``link(recipe, resolver)`` for each recipe whose checks pass (the doit
    task passes :func:`tasks.core.links.materialize`, which fills ``build/<recipe>/``). Returns counts: {"stages" (of
    all recipes), "submitted" (distinct stages sent to the cluster), "built", "reused" (a worker found the
    entry), "on_remote" (already there before), "pulled" (downloaded here), "seconds"}.
    Raises ClusterError naming what failed (no remote, no scheduler, no worker with enough
    MEMORY, a refused or failed stage, a recipe whose check fails). ``session``: the
    command's (default: a new one)."""
    session = session or Session()
    t0 = time.time()
    if remote.from_env() is None:
        raise ClusterError(NO_REMOTE)
    scheduler = scheduler or os.environ.get(ENV_SCHEDULER, "")
    if not scheduler:
        raise ClusterError(f"give the Dask scheduler: --scheduler tcp://host:8786 (or {ENV_SCHEDULER})")
    valid = {n for n, r in recipeset.recipes(session).items() if not r.abstract}
    recipes = list(recipes or sorted(valid))
    unknown = [r for r in recipes if r not in valid]
    if unknown:
        raise ClusterError(f"unknown recipe(s): {', '.join(unknown)} (known: {', '.join(sorted(valid))})")
    nodes, done, stage_node = plan(session, recipes, log)
    log(
        f"[cluster] {len(stage_node)} stages of {len(recipes)} recipe(s): {len(nodes)} distinct stage(s) to build "
        f"on {scheduler}, {len(done)} already cached"
    )
    results = dict(done)
    if nodes:
        results.update(_run(nodes, done, scheduler, log, timeout))
    # the client's part: pull what build/ and the checks read, check, record, link (builds
    # nothing: a Resolver only fetches; the other stages' keys come from remote manifests)
    from tasks.contract import artifact_patterns, implementations

    wanted = frozenset(k for k in kinds() if artifact_patterns(k) or any(st.check for st in implementations(k)))
    failed, pulled = [], 0
    for recipe in recipes:
        res = resolve.Resolver(session, recipe, pull=wanted)
        for name, spec in res.specs.items():
            try:
                e = res.entry(name)
            except keys.NotReady as err:
                raise ClusterError(f"{spec.task}: not on the remote after the cluster build ({err})") from None
            pulled += e.origin == "pulled"
            record(session, recipe, name, e.key, res.material(name), e, res.specs)
            bad = res.failures(name, e)
            if bad:
                failed.append(f"{spec.task} failed:\n  " + "\n  ".join(bad) + f"\n  (details: {e.out})")
        if link and not any(f.split(" ", 1)[0].endswith(f":{recipe}") for f in failed):
            link(recipe, res)
    out = {
        "stages": len(stage_node),
        "submitted": len(nodes),
        "built": sum(1 for n in nodes if results[n].get("built")),
        "reused": sum(1 for n in nodes if not results[n].get("built")),
        "on_remote": len(done),
        "pulled": pulled,
        "seconds": round(time.time() - t0, 2),
    }
    log("[cluster] " + ", ".join(f"{k} {v}" for k, v in out.items()))
    if failed:
        raise ClusterError("\n".join(failed))
    return out


def chain_lengths(nodes: dict) -> dict:
    """{node id: the number of stages on the longest chain from it to the end of the plan,
    itself included}: its Dask priority, so a free worker takes the stage with the longest
    chain still behind it (list scheduling by upward rank). An LLM's calibrations form the
    longest chain (calibrate.part{k} reads part k-1's), so each runs as soon as its input is
    there, ahead of an earlier part's quantize or compile (benchmarks/README: without it the
    scheduler ran part 0's compile before part 2's calibration)."""
    below: dict[str, list[str]] = {nid: [] for nid in nodes}
    for nid, n in nodes.items():
        for u in n["ups"].values():
            if u in below:
                below[u].append(nid)
    out: dict[str, int] = {}

    def length(nid: str) -> int:
        if nid not in out:
            out[nid] = 1 + max((length(d) for d in below[nid]), default=0)
        return out[nid]

    for nid in nodes:
        length(nid)
    return out


def _run(nodes: dict, done: dict, scheduler: str, log, timeout: float | None) -> dict:
    from distributed import Client, as_completed

    try:
        client = Client(scheduler, timeout=30)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {type(e).__name__}: {e}") from None
    try:
        try:
            client.wait_for_workers(1, timeout=60)
        except TimeoutError:
            raise ClusterError(f"no Dask worker joined {scheduler} within 60 s") from None
        offers = {a: (w.get("resources") or {}).get(RESOURCE, 0) for a, w in _workers(client).items()}
        most = int(max(offers.values(), default=0))
        big = [(n["tasks"][0], n["memory"]) for n in nodes.values() if n["memory"] > most]
        if big:
            raise ClusterError(
                "no worker of the cluster offers enough MEMORY for: "
                + ", ".join(f"{t} ({m} bytes = {_gib(m)})" for t, m in big)
                + f"; the largest offer is {most} bytes ({_gib(most)}) over {len(offers)} worker(s). Start a worker "
                f"with `dask worker {scheduler} --resources {RESOURCE}=<bytes>` (docs/environment.md: Cluster builds)"
            )
        run = uuid.uuid4().hex[:8]
        futs, names = {}, {}
        rank = chain_lengths(nodes)
        for nid, n in nodes.items():
            ups = {role: futs[u] if u in futs else done[u] for role, u in n["ups"].items()}
            spec = n["spec"]
            f = client.submit(
                build_on_worker,
                spec,
                ups,
                n["expected"],
                key=f"{spec.kind}-{nid[:16]}-{run}",
                resources={RESOURCE: n["memory"]},
                retries=0,
                priority=rank[nid],
            )
            futs[nid], names[f.key] = f, nid
        results, errors = {}, {}
        for f in as_completed(list(futs.values()), timeout=timeout):
            nid = names[f.key]
            tasks = ", ".join(nodes[nid]["tasks"])
            try:
                r = f.result()
            except Exception as e:  # a failed upstream fails its dependents with the same error
                errors.setdefault(f"{type(e).__name__}: {e}", []).append(tasks)
                continue
            results[nid] = r
            log(
                f"[cluster] {tasks}: {r['kind']}/{r['key'][:12]} "
                f"{'built' if r['built'] else 'reused (' + r['origin'] + ')'} on {r['worker']} in {r['seconds']}s"
            )
        if errors:
            raise ClusterError(
                "cluster build failed:\n"
                + "\n".join(f"  {msg}\n    (stages: {', '.join(ts)})" for msg, ts in errors.items())
            )
        return results
    finally:
        client.close()
