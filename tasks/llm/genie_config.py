"""Genie's config files for an :func:`tasks.llm.genie.export_genie` description:
``genie_config.json`` (:func:`genie_config`) and ``htp_backend_ext_config.json``
(:func:`htp_backend_ext_config`); which graphs each ``ctx-bins`` entry holds
(:func:`config_binaries`); and Genie's own parser run on a config (:func:`parse_config`,
``libGenie.so`` in a child process)."""

from __future__ import annotations

import os
from pathlib import Path


def genie_config(desc: dict, ctx_bins: list[str], *, tokenizer: str = "tokenizer.json",
                 extensions: str = "htp_backend_ext_config.json", n_threads: int = 1,
                 use_mmap: bool = False, debug: dict | None = None) -> dict:
    """``genie_config.json`` (a ``dialog`` of type basic; schema: Genie's embedded
    ``urn:genie:schema:dialog``) for a :func:`tasks.llm.genie.export_genie` description and its compiled
    binaries ``ctx_bins`` (paths as Genie opens them: relative to its working folder).
    Sampler greedy (``top-k`` 1, ``greedy``); context size = CL; ``bos-token``: what the HF
    tokenizer prepends (:func:`tasks.llm.genie.prepended_bos`, -1 = none), so Genie's token sequence is HF's; ``kv-dim`` = head_dim;
    ``pos-id-dim`` = rotary_dim / 2; ``rope-theta`` from the HF config (Genie reads an int)."""
    cfg = {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": desc["context_len"], "n-vocab": desc["vocab_size"],
                    "bos-token": desc["genie_bos_token"], "eos-token": desc["eos_token_id"]},
        "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 1.0, "greedy": True},
        "tokenizer": {"version": 1, "path": tokenizer},
        "engine": {"version": 1, "n-threads": n_threads,
                   "backend": {"version": 1, "type": "QnnHtp",
                               "QnnHtp": {"version": 1, "use-mmap": use_mmap, "spill-fill-bufsize": 0,
                                          "mmap-budget": 0, "poll": False, "cpu-mask": "0x1",
                                          "kv-dim": desc["head_dim"], "pos-id-dim": desc["rotary_dim"] // 2,
                                          "allow-async-init": False, "rope-theta": int(desc["rope_theta"])},
                               "extensions": extensions},
                   "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(ctx_bins)}}}}}
    if debug:
        cfg["dialog"]["debug"] = dict(debug)
    return cfg


def htp_backend_ext_config(target: str, weight_sharing: bool = False) -> dict:
    """``htp_backend_ext_config.json`` for ``target`` (a name in ``tasks/targets.py``: its QNN
    ``soc_model`` and ``v{htp_arch}``): one device, one core (burst), shared-buffer memory (AI
    Hub's ``create_genie_config`` fields)."""
    from ..targets import get as get_target

    tgt = get_target(target)
    return {"devices": [{"soc_model": tgt.soc_model, "dsp_arch": f"v{tgt.htp_arch}",
                         "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
            "memory": {"mem_type": "shared_buffer"},
            "context": {"weight_sharing_enabled": weight_sharing}}


def config_binaries(config: dict, desc: dict) -> dict[str, list[str]]:
    """{ctx-bins path: the graphs Genie will look for in it} of a ``genie_config.json``
    (:func:`genie_config`): a per-part weight-shared binary (``*_part_{i}_of_{N}.bin``) holds
    part i's prompt and token graphs, a per-graph binary (``{graph}.bin``) its graph. Raises
    ValueError naming a ctx-bins entry that is neither."""
    import re

    parts = {i + 1: p for i, p in enumerate(desc["parts"])}
    graphs = {p[k]["graph"]: p[k]["graph"] for p in desc["parts"] for k in ("prompt", "token")}
    out = {}
    for rel in config["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
        stem = Path(rel).stem
        m = re.fullmatch(r".*_part_(\d+)_of_(\d+)", stem)
        if stem in graphs:
            out[rel] = [stem]
        elif m and int(m.group(2)) == len(parts) and int(m.group(1)) in parts:
            p = parts[int(m.group(1))]
            out[rel] = [p["prompt"]["graph"], p["token"]["graph"]]
        else:
            raise ValueError(f"genie_config.json, dialog.engine.model.binary.ctx-bins: expected {{graph}}.bin or "
                             f"*_part_{{i}}_of_{len(parts)}.bin, found {rel!r}")
    return out


def _parse_child(text: str) -> None:
    """Child side of :func:`parse_config`: prints ``STATUS <n>`` (libGenie prints its reason)."""
    import ctypes as C

    import onnxruntime_qnn

    lib = C.CDLL(os.path.join(os.path.dirname(onnxruntime_qnn.__file__), "libGenie.so"))
    lib.GenieDialogConfig_createFromJson.argtypes = [C.c_char_p, C.POINTER(C.c_void_p)]
    lib.GenieDialogConfig_free.argtypes = [C.c_void_p]
    h = C.c_void_p()
    s = lib.GenieDialogConfig_createFromJson(text.encode(), C.byref(h))
    if h.value:
        lib.GenieDialogConfig_free(h)
    print(f"\nSTATUS {s}", flush=True)


def parse_config(text: str) -> tuple[int, str]:
    """Genie's own parser on a ``genie_config.json`` text (``GenieDialogConfig_createFromJson``
    of the wheel's ``libGenie.so``, schema ``urn:genie:schema:dialog``), in a child process
    (libGenie prints its reason to the console). Returns (status: 0 accepted, e.g. -8 schema
    error; the reason in one line, "" when accepted): e.g. ``at '/engine': ... validation failed
    for additional property 'n-threadz'``."""
    import re

    from ..proc.child import run_function

    r = run_function(_parse_child, text, timeout=300)
    said = r.stdout + "\n" + r.stderr
    m = re.search(r"^STATUS (-?\d+)$", said, re.M)
    if r.returncode != 0 or m is None:
        return -1, f"the parser's process ended with exit {r.returncode}: {r.tail(300)}"
    status = int(m.group(1))
    if status == 0:
        return 0, ""
    reasons = [ln.strip(" -") for ln in said.splitlines() if ln.strip().startswith("- at ")]
    first = next((ln.strip() for ln in said.splitlines() if "Failed" in ln or "failed" in ln), "")
    why = "; ".join(reasons) or first or "no reason printed"
    why = re.sub(r"(at least one subschema has failed, but all of them are required to validate - )+", "", why)
    return status, why
