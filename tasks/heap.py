"""Keep freed memory in the process while a stage of a small model runs (glibc's malloc).

A stage of the main job allocates and frees buffers of the model's size over and over: a
90 MB MiniLM graph is serialized and parsed ~20 times between export and quantize (onnx,
onnxruntime sessions, the quantizer's save-and-reload steps). glibc's malloc serves any
allocation above its mmap threshold (128 KiB, raised dynamically to at most 32 MiB) with a
fresh ``mmap`` and gives it back with ``munmap`` when freed, so every such buffer is
page-faulted in again, page by page. Measured on the main job from an empty cache through
compile (this project's 2-core CI machine, idle, 2026-11-30): 3.17 M minor page faults,
8.2 s system time of 17.2 s wall; with the thresholds raised while stages run: 0.51 M faults,
2.9 s system, 11.3 s wall, peak RSS 1.33 -> 1.42 GB. Output bytes do not change (the same
stage keys and output digests; tests/test_heap.py).

glibc's ``mallopt`` (``man 3 mallopt``): ``M_MMAP_THRESHOLD`` (allocations at least this big
use mmap; at most 2**31 - 1 here, ``mallopt`` takes an int) and ``M_TRIM_THRESHOLD`` (free
memory at the top of the heap above this is given back). Elsewhere (Windows, musl, macOS)
:func:`keep_freed` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import lru_cache

# mallopt parameter numbers, glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 128 * 1024  # both, glibc's defaults (malloc.h: DEFAULT_MMAP_THRESHOLD_MIN, DEFAULT_TRIM_THRESHOLD)
KEEP_THRESHOLD = 2**31 - 1  # bytes: the largest value mallopt's int takes

#: a stage keeps freed memory only when its upstream outputs total at most this many bytes
#: (the main job's export input is 91 MB; a 7B LLM's is ~15 GB, and its stages, which hold one
#: part at a time, must give memory back: issue 8's peaks were measured with glibc's defaults)
KEEP_INPUT_MAX = 1 << 30


@lru_cache(maxsize=1)
def _libc():
    """glibc's handle, or None when this process's C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        return libc
    except (OSError, AttributeError):
        return None


def available() -> bool:
    """True when :func:`keep_freed` can change anything (Linux with glibc)."""
    return _libc() is not None


_KEEPING = False


def keep_freed(keep: bool) -> bool:
    """Set this process's allocator up for the stage about to run. ``keep``: freed memory stays
    in the process for reuse (the mmap and trim thresholds become :data:`KEEP_THRESHOLD`,
    2 GiB - 1), and stays so for later stages that keep too (no trim between two stages of a
    small model: it would give back memory the next stage faults in again). Not ``keep``:
    both thresholds go back to 128 KiB (glibc's initial values; its dynamic raising of the
    mmap threshold stays off from then on) and ``malloc_trim(0)`` returns what is free, before
    the stage starts. Returns whether freed memory is kept from now on (always False when the
    C library is not glibc). Peak RSS of a keeping stage can grow by the freed memory kept
    (the main job: +7 %)."""
    global _KEEPING
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
