"""tasks/proc/heap.py: freed memory kept for reuse while a small model's stage runs (glibc).

Each case runs in its own interpreter: the allocator's thresholds are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, needs
from tasks.proc import heap


@pytest.fixture(autouse=True)
def _glibc():
    needs(heap.available(), "glibc (Linux)")


# allocate and free a 96 MiB buffer (written in full) twice; report the minor page faults of
# the second allocation
_PROBE = textwrap.dedent("""
    import json, resource, sys
    sys.path.insert(0, {repo!r})
    from tasks.proc import heap
    steps = {steps!r}
    kept = None
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    out = []
    for keep in steps:
        kept = heap.keep_freed(keep)
        b = b"x" * (96 << 20); del b
        f0 = faults()
        b = b"x" * (96 << 20); del b
        out.append([kept, faults() - f0])
    print(json.dumps(out))
""")


def _probe(steps: list[bool]) -> list[list]:
    r = subprocess.run(
        [sys.executable, "-c", _PROBE.format(repo=str(REPO), steps=steps)], capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout)


def test_kept_memory_is_not_faulted_in_again_and_defaults_come_back():
    # glibc's default: a 96 MiB buffer is mmap'd and munmap'd each time: ~24,576 pages faulted
    # in again; kept: reused from the heap, (almost) no faults; back to the defaults: faulted again
    ((default,),) = [_probe([False])]
    keep, back = _probe([True, False])
    assert default[0] is False and default[1] > 20_000, default
    assert keep[0] is True and keep[1] < 1_000, keep
    assert back[0] is False and back[1] > 20_000, back


_GC_PROBE = textwrap.dedent("""
    import atexit, gc, sys
    sys.path.insert(0, {repo!r})
    atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count(), flush=True))  # runs last
    from tasks.proc import heap
    print("default:", gc.get_threshold()[0], "frozen:", gc.get_freeze_count())
    heap.keep_freed(True)
    print("keeping:", gc.get_threshold()[0])
    heap.keep_freed(False)
    print("not keeping:", gc.get_threshold()[0])
""")


def test_gc_threshold_follows_the_stage_and_objects_are_frozen_at_exit():
    r = subprocess.run(
        [sys.executable, "-c", _GC_PROBE.format(repo=str(REPO))], capture_output=True, text=True, check=True
    )
    lines = r.stdout.splitlines()
    assert lines[0] == "default: 700 frozen: 0"
    assert lines[1] == f"keeping: {heap.GC_YOUNG}" and heap.GC_YOUNG > 700
    assert lines[2] == "not keeping: 700"
    frozen = int(lines[3].split(":")[1])
    assert frozen > 1_000, lines  # every object alive at exit (here ~10,000: the interpreter's own)


def test_only_stages_of_small_inputs_keep(tmp_path):
    from tasks.store.entry import Entry

    small = Entry(
        "export", "k", tmp_path, {"outputs": {"model.onnx": {"size": 90_331_157}, "vocab.txt": {"size": 231_508}}}
    )
    big = Entry("export", "k", tmp_path, {"outputs": {f"part{i}.onnx": {"size": 4 << 30} for i in range(4)}})
    assert heap.input_bytes({"model": small}) == 90_562_665
    assert heap.input_bytes({"model": small, "source": big}) == 90_562_665 + (16 << 30)
    assert heap.input_bytes({"model": small}) <= heap.KEEP_INPUT_MAX < heap.input_bytes({"source": big})
    assert heap.input_bytes({}) == 0
    # the Qwen2.5-0.5B shape's source (988 MB): its export gives memory back (at 1 GiB it kept: +21 % peak)
    qwen05 = Entry(
        "download",
        "k",
        tmp_path,
        {"outputs": {"model.safetensors": {"size": 988_097_824}, "tokenizer.json": {"size": 7_031_645}}},
    )
    assert heap.input_bytes({"source": qwen05}) > heap.KEEP_INPUT_MAX
