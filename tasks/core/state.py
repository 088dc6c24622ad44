"""A recipe's build state, typed: for each stage its spec, key, entry, status and the
failures of its check (:func:`build_state`); and :func:`artifacts`, the one listing of the
files a build ships. What the last build recorded (``build/<recipe>/stages.json``) is
:mod:`tasks.core.record`; a no-op build never imports this module.

Everything that reports on a build reads this: ``build/<recipe>/``
(:func:`tasks.core.links.materialize`), ``doit explain`` (:mod:`tasks.core.explain`), a recipe's
state (:func:`tasks.core.status.recipe_status`: the catalog's and publish's). A state is plain data computed once: it
holds :class:`tasks.store.entry.Entry` values (a folder and its manifest), never a Resolver or a
cache connection.

Statuses of a stage (:data:`STATUSES`): "local hit" (an intact entry in the local cache),
"remote hit" (only on the remote cache; a build downloads it), "failed" (a local entry whose
check fails, e.g. verify below its thresholds), "stale" (no entry for the current key; the
recipe's last build recorded one with another), "not built", "blocked" (an upstream has no
entry, so the key cannot be computed) or "unknown" (the key cannot be computed for another
reason, e.g. a Hub source while offline).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from tasks.store.entry import Entry
from tasks.recipe.plan import StageSpec
from tasks.contract import artifact_patterns
from tasks.core.keys import NotReady, stage_key

STATUSES = ("local hit", "remote hit", "failed", "stale", "not built", "blocked", "unknown")


def diff(old, new, prefix="") -> list[str]:
    """What changed between two JSON values, one line per changed leaf: ``a.b: 8 -> 12``,
    ``a.c: added 3``, ``a.d: removed (was 3)``; [] when equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            p = f"{prefix}.{k}" if prefix else str(k)
            if k not in old:
                out.append(f"{p}: added {json.dumps(new[k])}")
            elif k not in new:
                out.append(f"{p}: removed (was {json.dumps(old[k])})")
            else:
                out += diff(old[k], new[k], p)
        return out
    return [] if old == new else [f"{prefix}: {json.dumps(old)} -> {json.dumps(new)}"]


# ------------------------------------------------------------ the typed state


@dataclass(frozen=True)
class StageState:
    name: str
    spec: StageSpec
    status: str  # one of STATUSES
    key: str | None = None  # None when it cannot be computed ("blocked", "unknown")
    material: dict | None = None  # what the key is the hash of (tasks/core/keys.py key_material)
    entry: Entry | None = None  # the committed entry for ``key`` (local or remote)
    problem: str | None = None  # why there is no entry (or no key)
    failures: tuple[str, ...] = ()  # the stage check's findings on a local entry

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def target(self) -> str:
        """The compile target of a compile, bundle or verify stage, else ""."""
        return (
            self.spec.params.get("target", "") if self.kind in ("compile", "genie_compile", "bundle", "verify") else ""
        )


@dataclass(frozen=True)
class BuildState:
    recipe: str
    stages: dict[str, StageState] = field(default_factory=dict)  # in build order

    def of_kind(self, kind: str) -> list[StageState]:
        return [s for s in self.stages.values() if s.kind == kind]

    @property
    def entries(self) -> dict[str, Entry]:
        return {n: s.entry for n, s in self.stages.items() if s.entry is not None}

    @property
    def complete(self) -> bool:
        """Every stage has an entry."""
        return all(s.entry is not None for s in self.stages.values())


def build_state(res, last: dict) -> BuildState:
    """The state of ``res``'s recipe (``res``: a :class:`tasks.core.resolve.Resolver`) as
    ``res`` finds its entries (a build's Resolver pulls from the remote cache, explain's only
    peeks, the catalog's reads the local cache alone). ``last``: the recipe's
    ``build/<recipe>/stages.json`` rows (:func:`tasks.core.record.read_state`), which tell
    "stale" from "not built". Raises nothing of the stages' own: each one's problem is its
    state."""
    stages = {}
    for name, spec in res.specs.items():
        try:
            mat = res.material(name)
        except NotReady as err:
            stages[name] = StageState(name, spec, "blocked", problem=str(err))
            continue
        except Exception as err:  # e.g. an offline Hub source: the plan is still shown
            stages[name] = StageState(name, spec, "unknown", problem=f"{type(err).__name__}: {err}")
            continue
        key = stage_key(mat)
        try:
            e = res.entry(name)
        except NotReady as err:
            stages[name] = StageState(name, spec, "stale" if name in last else "not built", key, mat, problem=str(err))
            continue
        failures = tuple(res.failures(name, e)) if e.origin != "remote" else ()
        status = "failed" if failures else "remote hit" if e.origin == "remote" else "local hit"
        stages[name] = StageState(name, spec, status, key, mat, e, failures=failures)
    return BuildState(res.recipe, stages)


@dataclass(frozen=True)
class Artifact:
    stage: str
    kind: str
    key: str
    rel: str  # POSIX path inside the entry's out/
    path: Path  # the cache file
    size: int
    target: str


def artifacts(state: BuildState) -> dict[str, Artifact]:
    """{POSIX path in ``build/<recipe>/`` and in a published bundle: Artifact}: the outputs
    of the kinds whose implementations declare ``artifacts``, the files matching those patterns, from the
    entries' manifests; an export's only at its top level (an LLM export's part folders hold
    graphs). With several targets, compile and verify files go under ``<target>/``. Raises
    NotReady naming the first such stage without an entry. An LLM's parts each have a
    compile entry (``part{k}/``, ``shared/part{k}/``) and its ``bundle`` entry the files of the
    whole model: their union is the bundle's layout. With several targets an LLM's tokenizer
    files go into every ``<target>/`` (beside its ``genai_config.json``: onnxruntime-genai's
    ``og.Tokenizer`` reads them from the model's folder)."""
    targets = sorted({s.target for s in state.of_kind("compile")})
    many = len(targets) > 1
    llm = bool(state.of_kind("bundle"))
    out: dict[str, Artifact] = {}
    for st in state.stages.values():
        pats = artifact_patterns(st.kind)
        if not pats:
            continue
        if st.entry is None:
            raise NotReady(st.problem or f"{st.task} has no cache entry")
        if not many:
            subs = [""]
        elif st.target:
            subs = [f"{st.target}/"]
        else:  # an export's files: the model's tokenizer and config
            subs = [f"{t}/" for t in targets] if llm else [""]
        for rel, meta in sorted(st.entry.manifest["outputs"].items()):
            if st.kind == "export" and "/" in rel:
                continue
            if any(fnmatch(Path(rel).name, p) for p in pats):
                for sub in subs:
                    out[sub + rel] = Artifact(
                        st.name, st.kind, st.entry.key, rel, st.entry.out / rel, meta["size"], st.target
                    )
    return dict(sorted(out.items()))
