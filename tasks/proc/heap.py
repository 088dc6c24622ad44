"""Keep freed memory in the process while a stage of a small model runs (glibc's malloc), and
collect Python's cyclic garbage less often.

A stage of the main job allocates and frees buffers of the model's size over and over: a
90 MB MiniLM graph is serialized and parsed ~20 times between export and quantize (onnx,
onnxruntime sessions, the quantizer's save-and-reload steps). glibc's malloc serves any
allocation above its mmap threshold (128 KiB, raised dynamically to at most 32 MiB) with a
fresh ``mmap`` and gives it back with ``munmap`` when freed, so every such buffer is
page-faulted in again, page by page. Measured on the main job from an empty cache through
compile (this project's 2-core CI machine, idle, 2026-11-30): 3.17 M minor page faults,
8.2 s system time of 17.2 s wall; with the thresholds raised while stages run: 0.51 M faults,
2.9 s system, 11.3 s wall, peak RSS 1.33 -> 1.42 GB. Output bytes do not change (every
stage's output digest compared with glibc's defaults: the main job, and 7 recipes in one
process). tests/test_heap.py checks the mechanism (faults of a reused buffer).

Python's cyclic garbage collector runs a young collection every 700 net container
allocations (``gc.get_threshold()``); importing torch + transformers + optimum and loading the
model (the export stage) spends ~0.5 s of ~3.1 s in it, and the interpreter's exit spends
~0.7 s of 0.85 s collecting everything those imports created. While a keeping stage runs the
young threshold is :data:`GC_YOUNG` (import + load 3.1 -> 2.6 s), and a process that ran a stage
freezes its objects at exit (``gc.freeze``: exit 0.85 -> 0.15 s; measured 2026-11-30, same
machine).

glibc's ``mallopt`` (``man 3 mallopt``): ``M_MMAP_THRESHOLD`` (allocations at least this big
use mmap; at most 2**31 - 1 here, ``mallopt`` takes an int) and ``M_TRIM_THRESHOLD`` (free
memory at the top of the heap above this is given back). Elsewhere (Windows, musl, macOS)
:func:`keep_freed` leaves the allocator alone and returns False; the GC settings apply
everywhere.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import gc
import sys
from functools import lru_cache

# mallopt parameter numbers, glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 128 * 1024  # both, glibc's defaults (malloc.h: DEFAULT_MMAP_THRESHOLD_MIN, DEFAULT_TRIM_THRESHOLD)
KEEP_THRESHOLD = 2**31 - 1  # bytes: the largest value mallopt's int takes

#: a stage keeps freed memory only when its upstream outputs total at most this many bytes:
#: the main job's export input is 91 MB; LLM stages, which hold one part at a time, must give
#: memory back (the LLM peaks in benchmarks/README.md and tasks/llm/memory.py's estimates are
#: measured with glibc's defaults). At 1 GiB the Qwen2.5-0.5B shape's export (988 MB source)
#: kept its memory: peak RSS +21 % (1.47 -> 1.78 GiB) against an estimate of 1.81 GiB.
KEEP_INPUT_MAX = 256 << 20


@lru_cache(maxsize=1)
def _libc():
    """glibc's handle, or None when this process's C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _ = libc.gnu_get_libc_version  # only glibc has it (else AttributeError)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


def available() -> bool:
    """True when :func:`keep_freed` can change anything (Linux with glibc)."""
    return _libc() is not None


#: Python's young-generation GC threshold while a keeping stage runs (the default is 700)
GC_YOUNG = 10_000
_GC_DEFAULT = gc.get_threshold()
_KEEPING = False
_FREEZE_AT_EXIT = False  # registered yet?


def keep_freed(keep: bool) -> bool:
    """Set this process up for the stage about to run.

    ``keep`` (a stage of a small model): freed memory stays in the process for reuse (glibc's
    mmap and trim thresholds become :data:`KEEP_THRESHOLD`, 2 GiB - 1, and stay so for later
    stages that keep too: a trim between two of them would give back memory the next one
    faults in again), and Python's young GC threshold is :data:`GC_YOUNG`. Peak RSS of such a
    stage can grow by the freed memory kept (the main job: +7 %).
    Not ``keep``: both glibc thresholds go back to 128 KiB (glibc's initial values; its
    dynamic raising of the mmap threshold stays off from then on), ``malloc_trim(0)`` returns
    what is free before the stage starts, and the GC threshold is Python's default.
    The first call also makes the process freeze its objects at exit (``gc.freeze``).
    Returns whether freed memory is kept from now on (always False when the C library is not
    glibc; the GC settings apply everywhere)."""
    global _KEEPING, _FREEZE_AT_EXIT
    if not _FREEZE_AT_EXIT:  # whatever the stage imported is not collected at exit, one by one
        atexit.register(gc.freeze)
        _FREEZE_AT_EXIT = True
    gc.set_threshold(GC_YOUNG if keep else _GC_DEFAULT[0], *_GC_DEFAULT[1:])
    libc = _libc()
    if libc is None:
        return False
    if keep and not _KEEPING:
        libc.mallopt(M_MMAP_THRESHOLD, KEEP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, KEEP_THRESHOLD)
    elif not keep and _KEEPING:
        libc.mallopt(M_MMAP_THRESHOLD, DEFAULT_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_THRESHOLD)
        libc.malloc_trim(0)
    _KEEPING = keep
    return keep


def input_bytes(upstream: dict) -> int:
    """Total size in bytes of the outputs of a stage's upstream entries (``{role: Entry}``,
    sizes from their manifests' ``outputs``)."""
    return sum(int(f.get("size", 0)) for e in upstream.values() for f in e.manifest.get("outputs", {}).values())
