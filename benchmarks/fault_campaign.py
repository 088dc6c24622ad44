"""Fault campaign: SIGKILLed and concurrent builds, checked against a clean build (run by hand;
prints counts, exits 1 when a check failed).

    .venv/bin/python benchmarks/fault_campaign.py [--kills 20] [--concurrent 4] [--seed 0] [--recipes 2] [--keep DIR]

A throw-away project (a temp folder, or --keep DIR) with --recipes tiny-BERT recipes (the
tests' model and recipe: w8a16, then w4a16; they share download, export and prepatch and each
has its own quantize, compile (a real QNN context binary) and ``cpu-qdq`` verify), built
through the real ``doit`` CLI, as the tests do:

1. Reference: one build of every recipe from an empty cache: the sha256 of every file under
   build/, the cache entries (kind/key), each stage's seconds.
2. --kills rounds. Each starts from one of three states, picked at random: ``empty`` (the
   cache removed; build/ and the doit / stat-cache databases kept), ``fresh`` (cache, build/
   and databases removed) or ``after-kill`` (the state the previous round's kill left: its
   temp folders, lock files and partial entries, restored from a copy). A ``doit run
   build:...`` is started in its own session and its process group SIGKILLed at a time drawn
   uniformly from [0, typical duration), the typical duration being the reference's start-up
   plus the reference seconds of the stages whose entries are missing. The stage it was in is
   read from its ``cache/.tmp/<kind>-<key>-<pid>-*`` folder (else: ``startup`` before any
   stage line, ``linking build/`` once all of a recipe's stages printed theirs, ``finishing``
   once every ``build:<recipe>`` line is out, otherwise ``between stages``). A build that finished before its kill time is not counted and the
   round is drawn again. Then the entries the kill left are rehashed in full, the same build
   runs to the end and is checked: exit 0 and no traceback; build/ equal to the reference byte
   for byte (same files, same sha256); the cache's entries the reference's, all intact
   (rehashed); no ``cache/.tmp`` folders, ``cache/.locks`` files, ``cache/.damaged`` entries
   or files in the builds' TMPDIR left; and the rebuild built exactly the keys the kill left
   missing (from its console lines ``<task>  <key>  built``).
3. --concurrent ``doit run`` processes started at once on one empty cache (the same project:
   shared cache, build/ and doit database), half building the recipes in order, half in
   reverse: each must exit 0; every key must be built by exactly one of them (console lines);
   build/, entries and leftovers are checked as above.

Prints one line per round and a table of counts. Every doit process gets PYTHONPATH=<this
checkout> (so a checkout's own ``tasks`` is what runs) and a TMPDIR of its own.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

STATE = ("cache", "build", ".npubuild")  # what a project's builds write (relative to its root)
LINE = re.compile(r"^(\S+:\S+)\s+([0-9a-f]{12})\s+(built|cache hit|pulled|FAILED)\s+([\d.]+)s$", re.M)


def _rm(path: Path) -> None:
    def onerror(func, p, exc):  # read-only cache files
        os.chmod(p, stat.S_IRWXU)
        func(p)

    if path.is_dir():
        shutil.rmtree(path, onerror=onerror)
    elif path.exists():
        path.unlink()


def _sha(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root``."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}


def _listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


@dataclass
class Counts:
    kills: int = 0
    killed_at: Counter = field(default_factory=Counter)
    starts: Counter = field(default_factory=Counter)
    redrawn: int = 0  # builds that finished before their kill time
    rebuilt_correctly: int = 0
    leftovers: int = 0  # .tmp folders, lock files, TMPDIR files, .damaged entries after a rebuild
    wrong_outputs: int = 0  # rounds whose build/ or cache entries differ from the reference
    damaged_after_kill: int = 0  # committed entries that fail a full rehash right after a kill
    wrong_rebuilds: int = 0  # rebuilds that built a key that was there, or skipped a missing one
    failed_rebuilds: int = 0  # rebuilds that exited non-zero or printed a traceback
    concurrent: int = 0
    concurrent_ok: int = 0
    keys: int = 0
    keys_built_once: int = 0
    keys_built_more_than_once: int = 0
    keys_never_built: int = 0
    concurrent_leftovers: int = 0
    concurrent_build_equal: bool = False
    failures: list = field(default_factory=list)


class Campaign:
    def __init__(self, work: Path, model: Path, recipes: int = 2, say=print):
        from conftest import Project

        self.work, self.say = work, say
        self.p = Project(work / "proj", model)
        self.root = self.p.root
        self.names = [f"fc-{prec}" for prec in ("w8a16", "w4a16", "w8a8")[:recipes]]
        for n in self.names:
            self.p.recipe(n, precision=n.split("-", 1)[1])
        self.systmp = work / "tmpdir"
        self.systmp.mkdir(parents=True)
        self.env = dict(self.p.env, PYTHONUNBUFFERED="1", TMPDIR=str(self.systmp), TEMP=str(self.systmp),
                        TMP=str(self.systmp),
                        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.snapshot = work / "after-kill"
        self.n_logs = 0

    # ------------------------------------------------------------ running doit

    def start(self, targets: list[str]) -> tuple[subprocess.Popen, Path]:
        self.n_logs += 1
        log = self.work / "logs" / f"{self.n_logs:03d}.txt"
        log.parent.mkdir(exist_ok=True)
        with open(log, "w") as f:
            p = subprocess.Popen([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "-d", str(self.root),
                                  "run", *targets], env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        return p, log

    def targets(self, reverse: bool = False) -> list[str]:
        return [f"build:{n}" for n in (reversed(self.names) if reverse else self.names)]

    def run(self, targets: list[str]) -> tuple[int, str]:
        p, log = self.start(targets)
        return p.wait(timeout=1800), log.read_text()

    # ------------------------------------------------------------ state

    def entries(self) -> set[tuple[str, str]]:
        c = self.root / "cache"
        return {(k.name, e.name) for k in c.iterdir() if k.is_dir() and not k.name.startswith(".")
                for e in k.iterdir() if e.is_dir()} if c.is_dir() else set()

    def damaged(self, entries) -> list[str]:
        from tasks.cache import Cache

        c = Cache(self.root / "cache")
        return [f"{k}/{key}: {'; '.join(probs)}" for k, key in sorted(entries)
                if (probs := c.problems(k, key, full=True))]

    def reset(self, how: str) -> None:
        for d in ("cache",) if how == "empty" else STATE:
            _rm(self.root / d)
        if how == "after-kill":
            for d in STATE:
                if (self.snapshot / d).exists():
                    shutil.copytree(self.snapshot / d, self.root / d, symlinks=True)

    def keep_snapshot(self) -> None:
        _rm(self.snapshot)
        for d in STATE:
            if (self.root / d).exists():
                shutil.copytree(self.root / d, self.snapshot / d, symlinks=True)

    def leftovers(self) -> list[str]:
        """What is left after a finished build that should not be, and removes the files
        found in TMPDIR and cache/.damaged (so a later round counts only its own)."""
        c = self.root / "cache"
        out = [f"cache/.tmp/{n}" for n in _listing(c / ".tmp")] + [f"cache/.locks/{n}" for n in _listing(c / ".locks")]
        out += [f"cache/.damaged/{n}" for n in _listing(c / ".damaged")] + [f"TMPDIR/{n}" for n in _listing(self.systmp)]
        _rm(c / ".damaged")
        for n in _listing(self.systmp):
            _rm(self.systmp / n)
        return out

    # ------------------------------------------------------------ the campaign

    def reference(self) -> None:
        t0 = time.time()
        code, out = self.run(self.targets())
        self.ref_wall = time.time() - t0
        if code != 0:
            raise SystemExit(f"the reference build failed ({code}):\n{out}")
        self.ref_files = _sha(self.root / "build")
        self.ref_entries = self.entries()
        self.key_of = {key[:12]: (kind, key) for kind, key in self.ref_entries}
        self.seconds = {self.key_of[k][1]: float(s) for _, k, st, s in LINE.findall(out) if st == "built"}
        self.stage_of = {}  # key -> stage name (shared stages have one name in every recipe)
        for task, k, _, _ in LINE.findall(out):
            self.stage_of[self.key_of[k][1]] = task.split(":", 1)[0]
        self.tasks = {n: {t for t, *_ in LINE.findall(out) if t.endswith(f":{n}")} for n in self.names}
        self.startup = max(self.ref_wall - sum(self.seconds.values()), 0.5)
        left = self.leftovers()
        kinds = Counter(k for k, _ in self.ref_entries)
        self.say(f"reference build of {len(self.names)} recipes ({', '.join(self.names)}) from an empty cache: "
                 f"{self.ref_wall:.1f} s, {len(self.ref_entries)} entries ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))}), "
                 f"{len(self.ref_files)} files in build/; start-up and linking {self.startup:.1f} s, stages "
                 + ", ".join(f"{self.stage_of[k]} {s:.1f}" for k, s in sorted(self.seconds.items(), key=lambda x: self.stage_of[x[0]])))
        if len(self.seconds) != len(self.ref_entries) or left:
            raise SystemExit(f"the reference build is not a clean build (built lines {len(self.seconds)}, "
                             f"entries {len(self.ref_entries)}, left {left}):\n{out}")

    def phase(self, pid: int, out: str) -> str:
        live = [n.split("-") for n in _listing(self.root / "cache" / ".tmp") if f"-{pid}-" in n]
        if live:
            return " + ".join(sorted({self.stage_of.get(parts[1], parts[0]) for parts in live}))
        done = {task for task, *_ in LINE.findall(out)}
        if not done:
            return "startup"
        if all(f"build:{n} " in out for n in self.names):
            return "finishing"  # every line printed: doit saving its state, exiting
        for n in self.names:
            if f"build:{n} " not in out and self.tasks[n] <= done:
                return "linking build/"
        return "between stages"

    def check(self, counts: Counts, outs: list[str], codes: list[int]) -> tuple[list[str], list[str]]:
        """The checks after a finished build: (what failed, what was left behind)."""
        bad = []
        if any(codes) or any("Traceback" in o for o in outs):
            bad.append(f"exit codes {codes}" + (", a traceback" if any("Traceback" in o for o in outs) else ""))
            counts.failed_rebuilds += 1
        files = _sha(self.root / "build")
        differ = sorted(r for r in set(files) | set(self.ref_files) if files.get(r) != self.ref_files.get(r))
        entries = self.entries()
        wrong_entries = sorted(f"{k}/{key}" for k, key in entries ^ self.ref_entries)
        dmg = self.damaged(entries)
        if any("is damaged" in o for o in outs):
            dmg.append("a build quarantined an entry")
        if differ or wrong_entries or dmg:
            counts.wrong_outputs += 1
            bad += ([f"build/ differs from the reference: {', '.join(differ[:6])}"] if differ else []) + \
                ([f"entries not the reference's: {', '.join(wrong_entries[:6])}"] if wrong_entries else []) + \
                ([f"damaged: {'; '.join(dmg[:3])}"] if dmg else [])
        left = self.leftovers()
        if left:
            bad.append(f"left behind: {', '.join(left[:6])}")
        return bad, left

    def kill_round(self, counts: Counts, rng: random.Random, i: int) -> None:
        while True:
            how = rng.choice(["empty", "fresh", "after-kill"] if self.snapshot.exists() else ["empty", "fresh"])
            self.reset(how)
            before = self.entries()
            missing = self.ref_entries - before
            typical = self.startup + sum(self.seconds[k] for _, k in missing)
            at = rng.uniform(0, typical)
            targets = self.targets(reverse=rng.random() < 0.5)
            p, log = self.start(targets)
            t0 = time.monotonic()
            while p.poll() is None and time.monotonic() - t0 < at:
                time.sleep(0.01)
            killed_at = time.monotonic() - t0
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = p.wait()
            if code != -signal.SIGKILL:  # finished (or failed) before the kill time: draw again
                counts.redrawn += 1
                self.say(f"kill {i:2d}  start {how:<10}  the build ended ({code}) after {time.monotonic() - t0:4.1f} s, "
                         f"before its kill time {at:.1f} s: drawn again")
                if code != 0:
                    counts.failures.append(f"kill {i}: the build to be killed failed on its own ({code}):\n"
                                           f"{log.read_text()[-3000:]}")
                if counts.redrawn > 3 * max(counts.kills + 1, 5):
                    raise SystemExit("builds keep finishing before their kill time")
                continue
            break
        counts.kills += 1
        counts.starts[how] += 1
        where = self.phase(p.pid, log.read_text())
        counts.killed_at[where] += 1
        left_by_kill = self.entries()
        dmg = self.damaged(left_by_kill)
        counts.damaged_after_kill += len(dmg)
        self.keep_snapshot()
        t1 = time.time()
        code, out = self.run(targets)
        wall = time.time() - t1
        built = Counter(self.key_of.get(k, ("?", k))[1] for _, k, st, _ in LINE.findall(out) if st == "built")
        expected = {k for _, k in self.ref_entries - left_by_kill}
        bad, left = self.check(counts, [out], [code])
        if set(built) != expected or any(n > 1 for n in built.values()):
            counts.wrong_rebuilds += 1
            bad.append(f"rebuilt {sorted(self.stage_of.get(k, k) for k in built)}, "
                       f"expected {sorted(self.stage_of[k] for k in expected)}")
        if dmg:
            bad.append(f"damaged right after the kill: {'; '.join(dmg[:3])}")
        counts.leftovers += len(left)
        if not bad:
            counts.rebuilt_correctly += 1
        else:
            counts.failures.append(f"kill {i} ({how}, during {where}): " + "; ".join(bad) + f"\n  log: {self.work / 'logs'}")
        self.say(f"kill {i:2d}  start {how:<10}  at {killed_at:5.1f} s of ~{typical:4.1f}  "
                 f"during {where:<15}  entries left {len(left_by_kill)}/{len(self.ref_entries)}  "
                 f"rebuild {wall:5.1f} s, built {sum(built.values())}: " + ("ok" if not bad else "FAILED: " + "; ".join(bad)))

    def concurrent(self, counts: Counts, n: int) -> None:
        self.reset("fresh")
        _rm(self.snapshot)
        t0 = time.time()
        procs = [self.start(self.targets(reverse=j % 2 == 1)) for j in range(n)]
        codes = [p.wait(timeout=3600) for p, _ in procs]
        wall = time.time() - t0
        outs = [log.read_text() for _, log in procs]
        built = Counter()
        per_proc = []
        for o in outs:
            mine = [self.key_of.get(k, ("?", k))[1] for _, k, st, _ in LINE.findall(o) if st == "built"]
            built.update(mine)
            per_proc.append(len(mine))
        keys = {k for _, k in self.ref_entries}
        counts.concurrent = n
        counts.concurrent_ok = sum(c == 0 for c in codes)
        counts.keys = len(keys)
        counts.keys_built_once = sum(built[k] == 1 for k in keys)
        counts.keys_built_more_than_once = sum(c > 1 for c in built.values())
        counts.keys_never_built = sum(built[k] == 0 for k in keys)
        bad, left = self.check(counts, outs, codes)
        counts.concurrent_leftovers = len(left)
        counts.concurrent_build_equal = not any(b.startswith(("build/", "entries")) for b in bad)
        if counts.keys_built_more_than_once or counts.keys_never_built or set(built) - keys:
            bad.append("built per key: " + ", ".join(f"{self.stage_of.get(k, k)} {c}" for k, c in sorted(built.items())))
        if bad:
            counts.failures.append(f"{n} concurrent builds: " + "; ".join(bad) + f"\n  log: {self.work / 'logs'}")
        self.say(f"{n} concurrent builds on an empty cache: {wall:.1f} s, exit codes {codes}, stages built per process "
                 f"{per_proc}: " + ("ok" if not bad else "FAILED: " + "; ".join(bad)))


def campaign(work: Path, model: Path, kills: int = 20, concurrent: int = 4, seed: int = 0, recipes: int = 2,
             say=print) -> Counts:
    """Run the whole campaign in ``work`` (an empty folder) with the tiny BERT at ``model``."""
    counts = Counts()
    c = Campaign(work, model, recipes, say)
    c.reference()
    rng = random.Random(seed)
    for i in range(1, kills + 1):
        c.kill_round(counts, rng, i)
    if concurrent:
        c.concurrent(counts, concurrent)
    return counts


def summary(counts: Counts, kills: int) -> str:
    rows = [
        ("SIGKILLs delivered", counts.kills),
        ("  start state", ", ".join(f"{k} {v}" for k, v in sorted(counts.starts.items()))),
        ("  killed during", ", ".join(f"{k} {v}" for k, v in counts.killed_at.most_common())),
        ("  builds done before their kill time (redrawn)", counts.redrawn),
        ("rebuilt correctly", f"{counts.rebuilt_correctly} / {kills}"),
        ("leftovers after the rebuilds", counts.leftovers),
        ("wrong outputs (build/ or entries)", counts.wrong_outputs),
        ("entries damaged right after a kill", counts.damaged_after_kill),
        ("rebuilds that built the wrong keys", counts.wrong_rebuilds),
        ("rebuilds that failed", counts.failed_rebuilds),
    ]
    if counts.concurrent:
        rows += [
            ("concurrent builds that succeeded", f"{counts.concurrent_ok} / {counts.concurrent}"),
            ("keys built exactly once", f"{counts.keys_built_once} / {counts.keys}"),
            ("keys built more than once", counts.keys_built_more_than_once),
            ("keys never built", counts.keys_never_built),
            ("build/ and entries equal to the reference", "yes" if counts.concurrent_build_equal else "NO"),
            ("leftovers after the concurrent builds", counts.concurrent_leftovers),
        ]
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs, each followed by a checked rebuild")
    ap.add_argument("--concurrent", type=int, default=4, help="builds started at once on one empty cache (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipes", type=int, default=2, choices=(1, 2, 3))
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (created; must not exist) and keep it")
    args = ap.parse_args()

    from conftest import make_tiny_bert

    t0 = time.time()
    if args.keep:
        work = Path(args.keep).resolve()
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    try:
        model = make_tiny_bert(work / "tiny-bert")
        counts = campaign(work, model, args.kills, args.concurrent, args.seed, args.recipes)
    finally:
        if not args.keep:
            _rm(work)
    print(f"\n{args.kills} kills (seed {args.seed}), {args.concurrent} concurrent builds, {args.recipes} recipes, "
          f"{time.time() - t0:.0f} s in all")
    print(summary(counts, args.kills))
    for f in counts.failures:
        print(f"FAILED: {f}")
    sys.exit(1 if counts.failures else 0)


if __name__ == "__main__":
    main()
