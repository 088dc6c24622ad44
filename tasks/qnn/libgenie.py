"""``libGenie.so`` (onnxruntime-qnn's wheel) through ctypes: a Genie dialog
(:class:`GenieDialog`) and greedy generation through it in a child process
(:func:`generate_in_child`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tasks.errors import NpubuildError, UserError


#: the file name of Genie's library in onnxruntime-qnn's wheel
LIBRARY = "libGenie.so"


def library_path() -> Path | None:
    """Where onnxruntime-qnn's wheel keeps ``libGenie.so`` (its package folder), found without
    importing the wheel (``importlib.util.find_spec``); None when the package is not installed.
    The file itself may be missing (a build without Genie): callers check."""
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime_qnn")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / LIBRARY


def api_version() -> str | None:
    """``major.minor.patch`` of the installed ``libGenie.so``'s Genie API
    (``Genie_getApi{Major,Minor,Patch}Version``; 1.21.0 in onnxruntime-qnn 2.7.0), or None
    when the library is not there."""
    import ctypes as C

    path = library_path()
    if path is None or not path.is_file():
        return None
    lib = C.CDLL(str(path))
    return ".".join(str(getattr(lib, f"Genie_getApi{p}Version")()) for p in ("Major", "Minor", "Patch"))


class GenieError(NpubuildError, RuntimeError):
    """A Genie C API call returned a non-zero status (``Genie_Status_t``; 4 = context exceeded
    is a warning and not raised)."""


class GenieDialog:
    """A Genie dialog from ``libGenie.so`` (onnxruntime-qnn's wheel; Genie API 1.21). On x86_64
    ``libQnnHtp.so`` runs the binaries on the HTP simulator.

    ``config``: the ``genie_config.json`` text; paths in it are opened relative to the current
    folder. ``log_level``: 1 error .. 4 verbose, None for no logger; ``log``: a callable taking
    each formatted line (default: dropped). Use as a context manager: every handle must be freed
    (without ``GenieDialog_free`` / ``GenieDialogConfig_free`` / ``GenieLog_free`` the process
    segfaulted at exit, experiments/genie-run)."""

    def __init__(self, config: str, *, log_level: int | None = None, log=None):
        import ctypes as C

        import onnxruntime_qnn  # noqa: F401  (the wheel loaded first, as its EP registration does)

        self.C = C
        lib = self.lib = C.CDLL(str(library_path()))
        vp, i32, u32 = C.c_void_p, C.c_int32, C.c_uint32
        self._LOGCB = C.CFUNCTYPE(None, vp, C.c_char_p, C.c_int, C.c_uint64, vp)
        self._TOKCB = C.CFUNCTYPE(None, C.POINTER(u32), u32, C.c_int, vp)
        self._TXTCB = C.CFUNCTYPE(None, C.c_char_p, C.c_int, vp)
        sigs = {
            "GenieLog_create": [vp, self._LOGCB, C.c_int, C.POINTER(vp)],
            "GenieLog_free": [vp],
            "GenieDialogConfig_createFromJson": [C.c_char_p, C.POINTER(vp)],
            "GenieDialogConfig_bindLogger": [vp, vp],
            "GenieDialogConfig_free": [vp],
            "GenieDialog_create": [vp, C.POINTER(vp)],
            "GenieDialog_free": [vp],
            "GenieDialog_reset": [vp],
            "GenieDialog_setMaxNumTokens": [vp, u32],
            "GenieDialog_tokenQuery": [vp, C.POINTER(u32), u32, C.c_int, self._TOKCB, vp],
            "GenieDialog_query": [vp, C.c_char_p, C.c_int, self._TXTCB, vp],
        }
        for f, args in sigs.items():
            getattr(lib, f).argtypes, getattr(lib, f).restype = args, i32
        self.log_handle, self.cfg, self.dialog = vp(), vp(), vp()
        self._logcb = None
        if log_level is not None:
            libc = C.CDLL(None)
            libc.vsnprintf.argtypes = [C.c_char_p, C.c_size_t, C.c_char_p, vp]
            sink = log or (lambda line: None)

            def _cb(_h, fmt, level, ts, args):
                buf = C.create_string_buffer(16384)
                libc.vsnprintf(buf, 16384, fmt, args)
                sink(buf.value.decode(errors="replace").rstrip())

            self._logcb = self._LOGCB(_cb)
            self._check("GenieLog_create", lib.GenieLog_create(None, self._logcb, log_level, C.byref(self.log_handle)))
        self._check(
            "GenieDialogConfig_createFromJson", lib.GenieDialogConfig_createFromJson(config.encode(), C.byref(self.cfg))
        )
        if self.log_handle.value:
            self._check("GenieDialogConfig_bindLogger", lib.GenieDialogConfig_bindLogger(self.cfg, self.log_handle))
        t = time.perf_counter()
        self._check("GenieDialog_create", lib.GenieDialog_create(self.cfg, C.byref(self.dialog)))
        self.create_seconds = time.perf_counter() - t

    def _check(self, what, status):
        if status not in (0, 4):
            self.close()
            raise GenieError(f"{what} -> status {status}")
        return status

    def generate(self, prompt_ids, max_new_tokens: int) -> tuple[list[int], int, float]:
        """``GenieDialog_tokenQuery`` (sentence COMPLETE) on the token ids ``prompt_ids`` after
        ``GenieDialog_reset``, at most ``max_new_tokens`` (``GenieDialog_setMaxNumTokens``).
        Returns (generated token ids, the query's status, seconds)."""
        C = self.C
        self._check("GenieDialog_reset", self.lib.GenieDialog_reset(self.dialog))
        self._check("GenieDialog_setMaxNumTokens", self.lib.GenieDialog_setMaxNumTokens(self.dialog, max_new_tokens))
        out: list[int] = []

        def _cb(tok, n, code, ud):
            out.extend(tok[i] for i in range(n))

        cb = self._TOKCB(_cb)
        ids = (C.c_uint32 * len(prompt_ids))(*[int(t) for t in prompt_ids])
        t = time.perf_counter()
        s = self._check(
            "GenieDialog_tokenQuery", self.lib.GenieDialog_tokenQuery(self.dialog, ids, len(prompt_ids), 0, cb, None)
        )
        return out, s, time.perf_counter() - t

    def query(self, text: str) -> tuple[str, int, float]:
        """``GenieDialog_query`` (sentence COMPLETE) on ``text`` (Genie's tokenizer): (reply,
        status, seconds)."""
        out: list[str] = []
        cb = self._TXTCB(lambda resp, code, ud: out.append(resp.decode(errors="replace") if resp else ""))
        t = time.perf_counter()
        s = self._check("GenieDialog_query", self.lib.GenieDialog_query(self.dialog, text.encode(), 0, cb, None))
        return "".join(out), s, time.perf_counter() - t

    def close(self) -> None:
        """Free the dialog, its config and the logger (each once)."""
        if self.dialog.value:
            self.lib.GenieDialog_free(self.dialog)
            self.dialog = self.C.c_void_p()
        if self.cfg.value:
            self.lib.GenieDialogConfig_free(self.cfg)
            self.cfg = self.C.c_void_p()
        if self.log_handle.value:
            self.lib.GenieLog_free(self.log_handle)
            self.log_handle = self.C.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _dialog_child(config: str, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Child side of :func:`generate_in_child`: one JSON line per prompt; a failed Genie call
    is one ``{"error": ...}`` line and exit 3 (Genie prints its own reason beside it)."""
    try:
        with GenieDialog(config) as d:
            print(json.dumps({"create_seconds": d.create_seconds}), flush=True)
            for ids in prompts:
                toks, status, secs = d.generate(ids, max_new_tokens)
                print(json.dumps({"tokens": toks, "status": status, "seconds": secs}), flush=True)
    except GenieError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        raise SystemExit(3) from None


class GenieRunFailed(UserError, RuntimeError):
    """Genie could not create the dialog or answer every prompt; the message is one line with
    the failed call (or the signal that ended the process) and Genie's own reason."""


#: lines libGenie and the QNN libraries print that say nothing about a failure
_NOISE = ("# LIBNATIVE:", "[INFO]", "Traceback", "File ", "^", "~")


def genie_said(output: str) -> str:
    """What Genie printed of its own in a child's ``output`` (stdout + stderr), one line: the
    lines that are neither our JSON rows nor Python's traceback nor the QNN libraries'
    notices, joined with "; " (the last three), e.g. "Failure to initialize model. Config
    specifies context->size=4096, but loaded max-CL=64"; "" when it printed nothing else."""
    keep = []
    for ln in output.splitlines():
        s = ln.strip()
        if (
            not s
            or s.startswith("{")
            or s.startswith(_NOISE)
            or s.startswith(("tasks.", "SystemExit"))
            or s.startswith(("with ", "self.", "fn(", "_main()", "raise "))
        ):
            continue
        keep.append(s)
    return "; ".join(keep[-3:])


def generate_in_child(
    folder, prompts: list[list[int]], max_new_tokens: int, timeout: float = 3600, what: str | None = None
) -> dict:
    """Greedy tokens of every prompt (token ids) through ``GenieDialog_tokenQuery`` on
    ``folder/genie_config.json`` (paths in it relative to ``folder``), in a child process
    working in ``folder`` (a crash in the QNN libraries stays there); ``what`` names the config
    in messages (default: the folder). Returns {"tokens": [[id]],
    "status": [Genie status per prompt], "seconds": [per prompt], "create_seconds"}. Raises
    :class:`GenieRunFailed` (one line: the failed call or signal and :func:`genie_said`) when
    it fails or answers fewer prompts (issue 51 case 4: Genie's reason was line 42 of 59)."""
    from tasks.proc.child import run_function

    text = (Path(folder) / "genie_config.json").read_text()
    r = run_function(
        _dialog_child, text, [[int(t) for t in p] for p in prompts], max_new_tokens, cwd=str(folder), timeout=timeout
    )
    rows = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    got = [x for x in rows if "tokens" in x]
    if r.returncode != 0 or len(got) != len(prompts):
        import signal

        failed = next((x["error"] for x in rows if "error" in x), None)
        if failed is None:
            code = r.returncode
            failed = (
                f"the process ended with {signal.Signals(-code).name}"
                if code < 0 and -code in signal.valid_signals()
                else f"the process ended with exit {code}"
            )
        said = genie_said(r.stdout + "\n" + r.stderr)
        raise GenieRunFailed(
            f"Genie on {what or Path(folder) / 'genie_config.json'}: {failed} after {len(got)} of "
            f"{len(prompts)} prompts; Genie said: {said or 'nothing'}"
        )
    return {
        "tokens": [x["tokens"] for x in got],
        "status": [x["status"] for x in got],
        "seconds": [x["seconds"] for x in got],
        "create_seconds": rows[0].get("create_seconds"),
    }
