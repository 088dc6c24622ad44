"""A stage's output: all of it into its cache entry's ``log.txt``, on the console only what
matters.

:func:`capture` wraps one stage's run. For its duration, file descriptors 1 and 2 of the
process are redirected, so everything lands in the log: our prints, Python warnings,
``logging`` (transformers, optimum, onnxruntime's quantizer), and the C-level output of the
native libraries (onnxruntime, the QNN SDK), which ``sys.stdout`` swaps would miss.

- stdout (fd 1) goes to the log only: what a stage reports as it works is for the log;
- stderr (fd 2) goes to the log and, line by line, to the console (prefixed with the stage's
  task name) unless the line is on the :data:`HARMLESS` list below, together with its
  indented continuation lines (a Python warning's source line, a traceback's frames).

The log is written beside ``out/`` in the stage's temp folder, so it lands in the committed
entry (``cache/<kind>/<key>/log.txt``) but is neither an output nor part of the output digest.
Progress bars (``tasks/progress.py``) go to the terminal's stderr, saved before the redirect.

One stage at a time per process: the redirect is process-wide, so doit's thread-parallel mode
(``-P thread``) would mix logs; its default ``-n N`` runs stages in processes, which is fine.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import traceback
from contextlib import contextmanager
from pathlib import Path

from tasks import progress

LOG_NAME = "log.txt"

# Known harmless lines a stage's stderr (or stdout) may carry, as regexes searched in each line.
# They stay in log.txt and are not shown on the console; anything else on stderr is. One entry
# per message, with why it is harmless here. Keep this the only list.
HARMLESS = [
    # transformers 4.57 deprecated from_pretrained(torch_dtype=...); optimum 2.1 still passes it
    # when loading the model to export. Same dtype either way.
    (r"`torch_dtype` is deprecated! Use `dtype` instead!", "transformers, during optimum's export"),
    # torch.jit tracing during the ONNX export records some tensors (attention-mask constants,
    # shape arithmetic) as constants. Our graphs have static shapes on purpose
    # (no_dynamic_axes=True), so constants are what we want. The indented source line that
    # follows the warning is dropped with it.
    (r"TracerWarning: ", "torch.onnx export tracing"),
    # optimum's optional pass that deduplicates tied weights needs `accelerate`, which we do not
    # install; without it the graph is the same, tied weights may just be stored twice.
    (r"Weight deduplication check in the ONNX export requires accelerate", "optimum export"),
    # optimum recommends opset >= 18 for BERT; recipes default to 17 (ExportCfg.opset) and the
    # quantizer upgrades QDQ graphs to opset 21 anyway (16-bit activations need it).
    (r"Opset \d+ is lower than the recommended minimum opset \(\d+\) to export", "optimum export"),
    # printed on stdout by the QNN SDK's native libraries (libnative) when a QNN session or
    # compile starts: no thread-local config file, defaults used. Informational.
    (r"# LIBNATIVE: No alternate configuration present in libnative_tls\.conf", "QNN SDK"),
    # onnxruntime's quantizer advises its generic pre-processing (symbolic shape inference +
    # optimizer); the QNN path runs qnn_preprocess_model instead, and our shapes are static.
    (r"Please consider (to run )?pre-processing before quantization", "onnxruntime.quantization"),
    # onnxruntime's quantizer upgrades the model's opset to 21 for 16-bit / 4-bit QDQ types.
    (r"The original model opset version is \d+, which does not support", "onnxruntime.quantization"),
    # onnxruntime's quantizer, for 1-D weights (LayerNorm scale/bias, biases) it cannot quantize
    # per channel along axis 1; they are quantized per tensor, as QNN wants them.
    (r"Axis \d+ is out-of-range for weight ", "onnxruntime.quantization"),
    # qnn_preprocess_model names the nodes a graph exported without names has (PaddlePaddle's
    # Reshape and Flatten in PP-OCR's graphs), so the quantizer can refer to them
    (r"Node of type \w+ does not have a name\. Renamed to qnn_preproc_node_\d+", "onnxruntime.quantization"),
    # onnxruntime / QNN EP log lines at warning level ("[W:onnxruntime:...]"): advice about
    # node placement or session options. Our QNN sessions log at error level, so the builds
    # measured here printed none; the LLM CPU sessions keep onnxruntime's default (warning).
    # Errors ("[E:...") are not on this list, and a graph that is not entirely on HTP fails
    # the build anyway (NotOnNPU).
    (r"\[W:onnxruntime:", "onnxruntime / QNN EP warning log"),
]
_HARMLESS_RE = re.compile("|".join(f"(?:{p})" for p, _ in HARMLESS))


def harmless(line: str) -> bool:
    """Whether ``line`` is one of the known harmless messages (:data:`HARMLESS`)."""
    return bool(_HARMLESS_RE.search(line))


_STREAMS: dict[int, object] = {}


def _fd_stream(fd: int):
    """A text stream on file descriptor ``fd`` that is never closed. It is ``sys.stdout`` /
    ``sys.stderr`` during a capture; a logging handler created then keeps it, and it keeps
    writing wherever ``fd`` points afterwards (the console again)."""
    if fd not in _STREAMS:
        _STREAMS[fd] = open(fd, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)
    return _STREAMS[fd]


def _flush_c_stdio() -> None:
    """fflush(NULL): write out what the native libraries' C stdio buffers hold."""
    try:
        import ctypes

        libc = ctypes.CDLL(None) if os.name != "nt" else ctypes.cdll.msvcrt
        libc.fflush(None)
    except Exception:
        pass


class _Filter:
    """Splits stderr bytes into lines; shows the ones that matter on the console."""

    def __init__(self, console, label: str):
        self.console, self.label = console, label
        self.buf = b""
        self.show_last = None  # decision for the previous line (continuations follow it)

    def feed(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for ln in lines:
            self.line(ln.decode("utf-8", "replace"))

    def close(self) -> None:
        if self.buf:
            self.line(self.buf.decode("utf-8", "replace"))
            self.buf = b""

    def line(self, text: str) -> None:
        text = text.rsplit("\r", 1)[-1].rstrip()  # what a terminal would show of a \r-redrawn line
        if not text.strip() or text[:1] in (" ", "\t"):
            show = bool(self.show_last)  # a continuation: like the line it continues
        else:
            show = not harmless(text)
        self.show_last = show
        if show:
            self._write(f"[{self.label}] {text}\n" if self.label else text + "\n")

    def _write(self, s: str) -> None:
        try:
            from tqdm import tqdm

            with tqdm.external_write_mode(file=self.console):  # clear and redraw any bar
                self.console.write(s)
                self.console.flush()
        except Exception:
            pass


def _pump(fd: int, log, filt: _Filter) -> None:
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        log.write(data)
        filt.feed(data)
    filt.close()
    os.close(fd)


def _flush_python_streams() -> None:
    for s in (sys.stdout, sys.stderr):
        try:
            s.flush()
        except Exception:
            pass


@contextmanager
def capture(log_path: Path, label: str = ""):
    """Send everything written to fds 1 and 2 (and ``sys.stdout`` / ``sys.stderr``) during the
    block to ``log_path`` (appended); stderr lines not in :data:`HARMLESS` also to the console.
    An exception leaving the block is written to the log with its traceback, then re-raised."""
    _flush_python_streams()
    _flush_c_stdio()
    log = open(log_path, "ab", buffering=0)
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    console = open(os.dup(saved[2]), "w", encoding="utf-8", errors="replace", buffering=1)
    filt = _Filter(console, label)
    r, w = os.pipe()
    os.dup2(log.fileno(), 1)
    os.dup2(w, 2)
    os.close(w)
    pump = threading.Thread(target=_pump, args=(r, log, filt), name="stagelog", daemon=True)
    pump.start()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _fd_stream(1), _fd_stream(2)
    prev = progress._console, progress._label
    progress._console, progress._label = console, label
    try:
        yield log_path
    except BaseException:
        sys.stdout.flush()
        sys.stdout.write(traceback.format_exc())  # into the log (stdout: not echoed twice)
        raise
    finally:
        _flush_python_streams()
        _flush_c_stdio()
        sys.stdout, sys.stderr = old
        progress._console, progress._label = prev
        os.dup2(saved[1], 1)
        os.dup2(saved[2], 2)  # drops our last handle on the pipe's write end: the pump sees EOF
        for fd in saved.values():
            os.close(fd)
        pump.join(timeout=10)  # a child process still holding the pipe would keep it open
        if not pump.is_alive():
            console.close()
            log.close()
