"""Running a family's graphs over arrays: the fp32 or QDQ graph on the CPU EP in this process,
a compiled EPContext model on QNN HTP (the simulator on x86_64) in child processes.

A *sequence* is a list of feeds run in order in one session; ``recurrent`` ({input: output})
names inputs each step takes from the previous step's outputs (Silero VAD's ``state`` <-
``stateN``; the first step's value is the one in its feed). Sequences are independent of one
another, so the HTP side spreads them over up to :func:`workers` child processes (the
simulator runs one inference at a time per process: ``tasks/encoder/verify.py`` measured it).
Outputs come back as {output name: float array} per step, in order.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tasks.proc import lazy

np = lazy.module("numpy")


def workers(count: int) -> int:
    """Child processes for ``count`` sequences: one per core, at most 4, at most ``count``."""
    return max(1, min(os.cpu_count() or 1, 4, count))


def run_sequence(session, feeds: list[dict], recurrent: dict[str, str] | None = None) -> list[dict]:
    """Run ``feeds`` in order through ``session`` (an onnxruntime session); returns every
    output of every step ({name: array}). ``recurrent``: {input: output} fed back."""
    names = [o.name for o in session.get_outputs()]
    out, carry = [], {}
    for f in feeds:
        got = dict(zip(names, session.run(names, {**f, **carry})))
        out.append(got)
        carry = {i: got[o] for i, o in (recurrent or {}).items()}
    return out


def cpu_sequences(model: Path, seqs: list[list[dict]], recurrent: dict[str, str] | None = None) -> list[list[dict]]:
    """:func:`run_sequence` of each sequence on the CPU EP (``tasks.qnn.cpu_session``)."""
    from tasks.qnn import ep as qnn

    s = qnn.cpu_session(model)
    return [run_sequence(s, seq, recurrent) for seq in seqs]


def htp_sequences(
    ctx: Path, target: str, seqs: list[list[dict]], recurrent: dict[str, str] | None = None
) -> list[list[dict]]:
    """:func:`run_sequence` of each sequence on HTP through EPContext model ``ctx`` compiled for
    ``target``, in :func:`workers` child processes (``tasks/proc/child.py``), each its own
    session over every n-th sequence. Raises RuntimeError with a child's output when one fails."""
    from concurrent.futures import ThreadPoolExecutor

    from tasks.proc.child import run_function

    n = workers(len(seqs))
    with tempfile.TemporaryDirectory(prefix="htp-") as tmp:
        work = Path(tmp)
        for i, seq in enumerate(seqs):
            _save(work / f"seq{i}.pkl", seq)
        with ThreadPoolExecutor(n) as pool:
            runs = [
                pool.submit(
                    run_function, _child, str(ctx), target, str(work), len(seqs), k, n, recurrent or {}, forward=True
                )
                for k in range(n)
            ]
            for k, r in enumerate(runs):
                res = r.result()
                if res.returncode != 0:
                    raise RuntimeError(
                        f"HTP run of {ctx.name}: the child for sequences {k}::{n} failed "
                        f"(exit {res.returncode}):\n{res.tail(2000)}"
                    )
        return [_load(work / f"out{i}.pkl") for i in range(len(seqs))]


def _save(path: Path, steps: list[dict]) -> None:
    """Steps ({name: array}) into a file only this module's processes read (pickle: names
    with ``/`` in them, as PP-OCR's outputs have, would be folders in an ``.npz``)."""
    import pickle

    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps([{k: np.asarray(v) for k, v in s.items()} for s in steps], protocol=5))
    os.replace(tmp, path)  # the parent never reads half a file


def _load(path: Path) -> list[dict]:
    import pickle

    return pickle.loads(path.read_bytes())


def _child(ctx: str, target: str, work: str, count: int, first: int, step: int, recurrent: dict) -> None:
    """The child side of :func:`htp_sequences`: sequences ``first``, ``first + step``, ... read
    from ``seq<i>.pkl``, their outputs written to ``out<i>.pkl``."""
    from tasks.qnn import ep as qnn

    w = Path(work)
    s = qnn.htp_session(Path(ctx), target)
    for i in range(first, count, step):
        _save(w / f"out{i}.pkl", run_sequence(s, _load(w / f"seq{i}.pkl"), recurrent))
