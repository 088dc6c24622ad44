"""Genie's config files for an :func:`tasks.llm.genie.graphs.export_genie` description:
``genie_config.json`` (:func:`genie_config`, with the device's engine settings
:data:`DEVICE_SETTINGS`; :func:`with_settings` puts :data:`SIMULATOR_SETTINGS` into verify's
copy) and ``htp_backend_ext_config.json`` (:func:`htp_backend_ext_config`); which graphs each
``ctx-bins`` entry holds (:func:`config_binaries`); and Genie's own parser run on a config
(:func:`parse_config`, ``libGenie.so`` in a child process)."""

from __future__ import annotations

from pathlib import Path

#: The engine settings a shipped ``genie_config.json`` carries, for the device (Genie's key
#: names; ``n-threads`` is the engine's, the rest ``backend.QnnHtp``'s). Source: Qualcomm AI Hub
#: Models, ``qai_hub_models/utils/llm_helpers.py`` ``create_genie_config``, which writes these
#: values for every device; QAIRT's Genie docs say of ``use-mmap`` that it "typically should be
#: turned on". ``cpu-mask`` 0xe0 = cores 5-7 (the performance cores of the Snapdragons AI Hub
#: targets); ``poll`` true: the host thread spins on the NPU's completion instead of sleeping.
DEVICE_SETTINGS = {
    "n-threads": 3,
    "use-mmap": True,
    "poll": True,
    "cpu-mask": "0xe0",
    "spill-fill-bufsize": 0,
    "mmap-budget": 0,
    "allow-async-init": False,
}

#: What verify changes in its copy of the shipped config to run Genie on the x86_64 HTP
#: simulator (:func:`tasks.llm.compare._genie_generate`); never shipped. Only ``poll``: the
#: simulator runs with every device setting (tiny Qwen2, 6 prompts x 16 tokens on the per-graph
#: binaries, 2 shared cores at load 8-17: Genie's tokens equal verify's under the device settings,
#: each alone and all together), but polling spins a host core the simulated NPU computes on:
#: poll true took 45-50 CPU s (58-71 s wall) where poll false took 13-25 CPU s (14-37 s), with
#: the device's 3 threads, cpu-mask 0xe0 and use-mmap (19-25 CPU s) as with the settings shipped
#: before (1 thread, cpu-mask 0x1, use-mmap false: 13-24 CPU s).
SIMULATOR_SETTINGS = {"poll": False}

ENGINE_KEYS = ("n-threads",)  # the settings that sit in ``dialog.engine``; the rest in ``backend.QnnHtp``


def with_settings(cfg: dict, settings: dict) -> dict:
    """A copy of the ``genie_config.json`` dict ``cfg`` with ``settings`` ({Genie key: value},
    e.g. :data:`SIMULATOR_SETTINGS`) put where Genie's schema has them: :data:`ENGINE_KEYS` in
    ``dialog.engine``, the others in ``dialog.engine.backend.QnnHtp``."""
    import copy

    out = copy.deepcopy(cfg)
    engine = out["dialog"]["engine"]
    for k, v in settings.items():
        (engine if k in ENGINE_KEYS else engine["backend"]["QnnHtp"])[k] = v
    return out


def genie_config(
    desc: dict,
    ctx_bins: list[str],
    *,
    tokenizer: str = "tokenizer.json",
    extensions: str = "htp_backend_ext_config.json",
    settings: dict = DEVICE_SETTINGS,
    debug: dict | None = None,
) -> dict:
    """``genie_config.json`` (a ``dialog`` of type basic; schema: Genie's embedded
    ``urn:genie:schema:dialog``) for a :func:`tasks.llm.genie.graphs.export_genie` description and its compiled
    binaries ``ctx_bins`` (paths as Genie opens them: relative to its working folder).
    Sampler greedy (``top-k`` 1, ``greedy``); context size = CL; ``bos-token``: what the HF
    tokenizer prepends (:func:`tasks.llm.genie.graphs.prepended_bos`, -1 = none), so Genie's token sequence is HF's;
    ``kv-dim`` = head_dim; ``pos-id-dim`` = rotary_dim / 2; ``rope-theta`` from the HF config (Genie reads an int).
    Engine settings (threads, cpu-mask, poll, mmap...): ``settings``, by default the device's
    (:data:`DEVICE_SETTINGS`), through :func:`with_settings`."""
    cfg = {
        "dialog": {
            "version": 1,
            "type": "basic",
            "context": {
                "version": 1,
                "size": desc["context_len"],
                "n-vocab": desc["vocab_size"],
                "bos-token": desc["genie_bos_token"],
                "eos-token": desc["eos_token_id"],
            },
            "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 1, "top-p": 1.0, "greedy": True},
            "tokenizer": {"version": 1, "path": tokenizer},
            "engine": {
                "version": 1,
                **{k: settings[k] for k in ENGINE_KEYS if k in settings},  # Genie's order
                "backend": {
                    "version": 1,
                    "type": "QnnHtp",
                    "QnnHtp": {
                        "version": 1,
                        "kv-dim": desc["head_dim"],
                        "pos-id-dim": desc["rotary_dim"] // 2,
                        "rope-theta": int(desc["rope_theta"]),
                    },
                    "extensions": extensions,
                },
                "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": list(ctx_bins)}},
            },
        }
    }
    if debug:
        cfg["dialog"]["debug"] = dict(debug)
    return with_settings(cfg, settings)


def htp_backend_ext_config(target: str, weight_sharing: bool = False) -> dict:
    """``htp_backend_ext_config.json`` for ``target`` (a name in ``tasks/qnn/targets.py``: its QNN
    ``soc_model`` and ``v{htp_arch}``): one device, one core (burst), shared-buffer memory (AI
    Hub's ``create_genie_config`` fields)."""
    from tasks.qnn.targets import get as get_target

    tgt = get_target(target)
    return {
        "devices": [
            {
                "soc_model": tgt.soc_model,
                "dsp_arch": f"v{tgt.htp_arch}",
                "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}],
            }
        ],
        "memory": {"mem_type": "shared_buffer"},
        "context": {"weight_sharing_enabled": weight_sharing},
    }


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
            raise ValueError(
                f"genie_config.json, dialog.engine.model.binary.ctx-bins: expected {{graph}}.bin or "
                f"*_part_{{i}}_of_{len(parts)}.bin, found {rel!r}"
            )
    return out


def _parse_child(text: str) -> None:
    """Child side of :func:`parse_config`: prints ``STATUS <n>`` (libGenie prints its reason)."""
    import ctypes as C

    import onnxruntime_qnn  # noqa: F401  (the wheel loaded first, as its EP registration does)

    from tasks.qnn.libgenie import library_path

    lib = C.CDLL(str(library_path()))
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

    from tasks.proc.child import run_function

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
    # Genie's own one-line reasons ("Unknown dialog config key: foo", "Invalid dialog config:
    # dialog is not an object", "Missing dialog field: dialog"): the last line it wrote
    last = next((ln.strip() for ln in reversed(said.splitlines()) if ln.strip() and not ln.startswith("STATUS")), "")
    why = "; ".join(reasons) or first or last or "no reason printed"
    why = re.sub(r"(at least one subschema has failed, but all of them are required to validate - )+", "", why)
    return status, why
