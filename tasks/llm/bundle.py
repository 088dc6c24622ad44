"""The bundle stage, the LLM implementation (the contract: tasks/contract/__init__.py): the join
of an LLM's parts.

Each part is exported, calibrated, quantized and compiled by stages of its own
(``tasks/recipe/plan.py``); this stage writes what belongs to the whole model, from the parts'
entries: ``export.json`` (every part's graph I/O as the quantized parts declare it, the KV
cache's dtype and encoding among it: :mod:`tasks.llm.quantize`; each part's ``weight_bytes``
from its own export, and ``checkpoint_bytes_read`` summed over the parts), the host-side
embedding table (``embedding: host``) and ``genai_config.json`` (:func:`write_genai_files`).
``build/<recipe>/`` links it beside the parts' compile entries: the same layout a whole-model compile wrote before the
parts were stages.

With ``runtimes`` holding ``genie`` (recipe ``bundle.runtimes``) it also writes Genie's files
(:func:`write_genie`): ``genie_config.json`` naming the parts' Genie binaries
(``genie_compile.part{k}``: ``genie/{model_type}_part_{i}_of_{N}.bin`` with weight sharing,
else ``genie/part{k}/{graph}.bin``), ``htp_backend_ext_config.json`` and ``tokenizer.json``;
Genie's own parser checks the config, and every binary it names is read back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tasks.errors import UserError
from tasks.qnn.ep import provider_options
from tasks.contract.common import target_key_extra
from tasks.contract.stage import Stage
from tasks.contract.params import WEIGHT_SHARING
from tasks.llm.genie.names import genie_files, joined_genie_description
from tasks.llm.memory import plan_estimate


def preflight(recipe) -> list[tuple[str, str]]:
    """``bundle.runtimes: [.., genie]`` needs what the Genie export writes and verify can run
    (tasks/llm/genie/graphs.py): the embedding in part 0 (Genie feeds ``input_ids``), verified on the
    HTP simulator (verify runs Genie on the per-graph binaries), and ``libGenie.so`` installed
    (:func:`genie_library_missing`); ``bundle.genie_config`` only with genie, and none that the
    binaries cannot serve or that names a file the bundle does not ship
    (:func:`genie_override_problems`) or that Genie's parser refuses (:func:`genie_parser_problems`)."""
    b = recipe.bundle
    if "genie" in b.runtimes and b.genie_config:
        if unservable := genie_override_problems(
            b.genie_config, recipe.export.context_length, recipe.export.sequence_length
        ):
            return unservable
    if "genie" not in b.runtimes:
        if b.genie_config is not None:
            from tasks.contract.schema import found

            return [
                (
                    "bundle.genie_config",
                    f"expected no genie_config without runtime genie in bundle.runtimes, found {found(b.genie_config)}",
                )
            ]
        return []
    bad = []
    if missing := genie_library_missing():
        return [("bundle.runtimes", missing)]
    if b.genie_config and (refused := genie_parser_problems(b.genie_config, recipe.export.context_length)):
        return refused
    if recipe.export.embedding != "first-part":
        bad.append(("export.embedding: first-part", f"export.embedding: {recipe.export.embedding}"))
    if recipe.verify.backend != "htp":
        bad.append(
            ("verify.backend: htp (verify runs Genie on the simulator)", f"verify.backend: {recipe.verify.backend}")
        )
    if bad:
        return [
            (
                "bundle.runtimes",
                f"expected {', '.join(b[0] for b in bad)} for runtime genie, found {', '.join(b[1] for b in bad)}",
            )
        ]
    return []


#: genie_config.json keys (path under ``dialog``) that name a file the bundle writes itself:
#: the one tokenizer file Genie reads and the bundle ships, the HTP extensions config; and the
#: context binaries, named from the Genie export (:func:`tasks.llm.genie.names.genie_files`).
SHIPPED_FILES = {
    ("tokenizer", "path"): "tokenizer.json",
    ("engine", "backend", "extensions"): "htp_backend_ext_config.json",
    ("engine", "model", "binary", "ctx-bins"): None,
}


#: genie_config.json keys (path under ``dialog``) written from the model and its export, which
#: the binaries are compiled for: an override ships a config they do not match (a stranger's
#: ``kv-dim: 48`` on a head size of 32 shipped; the simulator did not notice)
MODEL_FACTS = {
    ("context", "n-vocab"): "the vocabulary (config.json vocab_size)",
    ("engine", "backend", "QnnHtp", "kv-dim"): "the head size (head_dim)",
    ("engine", "backend", "QnnHtp", "pos-id-dim"): "half the rotary dimension",
    ("engine", "backend", "QnnHtp", "rope-theta"): "config.json rope_theta",
}


def _at(d: dict, path: tuple):
    """The value at ``path`` in nested dicts ``d``, or KeyError (the class) when absent."""
    for k in path:
        d = d.get(k, KeyError) if isinstance(d, dict) else KeyError
    return d


def genie_override_problems(over: dict, context_length: int, sequence_length: int = 1) -> list[tuple[str, str]]:
    """``(key path, message)`` for each key of ``bundle.genie_config`` (``over``, merged over
    the generated config at bundle time) that Genie's parser accepts but the bundle cannot
    serve, known from the recipe alone: ``dialog.context.size`` beyond ``context_length``
    (tokens; the binaries' KV cache and attention mask are compiled for it: Genie fails
    creating the dialog only in verify, ~80 s in, issue 51 case 4) or below
    ``sequence_length`` (one prefill window), a value the bundle writes from the model
    (:data:`MODEL_FACTS`), and a file the bundle does not ship (:data:`SHIPPED_FILES`: another
    tokenizer path, extensions file or ``ctx-bins``, which Genie opens relative to the
    bundle)."""
    from tasks.contract.schema import found

    d = over.get("dialog") if isinstance(over, dict) else None
    if not isinstance(d, dict):
        return []
    bad = []
    size = _at(d, ("context", "size"))
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    if size is not None and size > context_length:
        bad.append(
            (
                "bundle.genie_config.dialog.context.size",
                f"expected at most export.context_length {context_length} (the context the binaries are "
                f"compiled for), found {size}",
            )
        )
    elif size is not None and size < sequence_length:
        bad.append(
            (
                "bundle.genie_config.dialog.context.size",
                f"expected at least export.sequence_length {sequence_length} (one prefill window: a smaller "
                f"context holds no prompt, and verify's Genie run gave no token), found {size}",
            )
        )
    for path, what in MODEL_FACTS.items():
        if (v := _at(d, path)) is not KeyError:
            bad.append(
                (
                    f"bundle.genie_config.dialog.{'.'.join(path)}",
                    f"expected no override (the bundle writes it from {what}, which the binaries are "
                    f"compiled for), found {found(v)}",
                )
            )
    for path, shipped in SHIPPED_FILES.items():
        if (v := _at(d, path)) is KeyError or v == shipped:
            continue
        what = f"{shipped!r} (the file the bundle ships)" if shipped else "no ctx-bins (the bundle names its binaries)"
        bad.append((f"bundle.genie_config.dialog.{'.'.join(path)}", f"expected {what}, found {found(v)}"))
    return bad


def genie_parser_problems(over: dict, context_length: int) -> list[tuple[str, str]]:
    """``bundle.genie_config`` (``over``) merged over the config the bundle generates, through
    Genie's own parser (:func:`tasks.llm.genie.config.parse_config`, a child process) when the
    recipe loads: a key Genie's schema does not know or a value of the wrong type is refused
    before any stage runs, with Genie's reason (before: at the bundle stage, after every Genie
    stage had built; issue 51). The generated part is the recipe's (context length, device
    settings) with stand-ins for what the export fills (vocabulary, head size, token ids,
    binary names), values of the types Genie's schema asks for, which it checks and the
    bundle's own parse checks again with the real ones (:func:`write_genie`)."""
    from tasks.llm.genie.config import genie_config, parse_config

    stand_in = {
        "context_len": context_length,
        "vocab_size": 2,
        "genie_bos_token": -1,
        "eos_token_id": 1,
        "head_dim": 64,
        "rotary_dim": 64,
        "rope_theta": 10000,
    }
    status, why = parse_config(json.dumps(deep_merge(genie_config(stand_in, ["part.bin"]), over)))
    if status == 0:
        return []
    return [
        (
            "bundle.genie_config",
            f"expected keys and values Genie's parser (GenieDialogConfig_createFromJson) accepts once merged "
            f"over the generated genie_config.json, found status {status}: {why}",
        )
    ]


def genie_library_missing() -> str:
    """ "" when onnxruntime-qnn's wheel holds ``libGenie.so`` (what the bundle's parser check and
    verify load: :mod:`tasks.qnn.libgenie`), else the message naming where it was looked for.
    Found without importing the wheel (:func:`tasks.qnn.libgenie.library_path`). Before, a missing library
    was reported after five stages as a config Genie's parser refused (issue 51 case 5)."""
    from tasks.store import plancache
    from tasks.qnn.libgenie import library_path

    plancache.note_sys_path()
    lib = library_path()
    if lib is None:
        return "expected onnxruntime-qnn installed for runtime genie (its wheel ships libGenie.so), found it missing"
    plancache.note(lib)
    if not lib.is_file():
        return f"expected libGenie.so for runtime genie (onnxruntime-qnn's wheel ships it), found none at {lib}"
    return ""


def joined_description(export_dirs: list[Path]) -> dict:
    """The whole model's ``export.json`` from the parts' export folders, or the quantized parts'
    (part k's folder describes every part and writes part k; a quantize entry's copy declares
    part k's quantized boundary tensors): part 0's description with each part's row taken from
    that part's own folder and ``checkpoint_bytes_read`` summed. Raises ValueError
    when the parts disagree on anything else (they come from different exports)."""
    descs = [json.loads((Path(d) / "export.json").read_text()) for d in export_dirs]
    out = dict(descs[0])
    out["parts"] = [d["parts"][k] for k, d in enumerate(descs)]
    if "checkpoint_bytes_read" in out:
        out["checkpoint_bytes_read"] = sum(d.get("checkpoint_bytes_read", 0) for d in descs)
    for k, d in enumerate(descs[1:], 1):
        rest = {n: v for n, v in d.items() if n not in ("parts", "checkpoint_bytes_read")}
        if rest != {n: v for n, v in out.items() if n not in ("parts", "checkpoint_bytes_read")}:
            raise ValueError(f"part {k}'s export.json describes another model or shape than part 0's")
    return out


def write_genai_files(desc: dict, embed_dir: Path, out: Path, params: dict) -> None:
    """What a bundle holds beside the parts' binaries: ``export.json`` (``desc``, every part's
    graph I/O, what LLMRunner reads), the host-side embedding table (``embed: separate``,
    copied from ``embed_dir``) and ``genai_config.json`` for onnxruntime-genai (only when
    part 0 takes ``input_ids``: genai's pipeline starts from them), naming the weight-shared
    binaries when ``params["weight_sharing"]``, else the per-graph ones."""
    from tasks.llm.genai import bundle_files, write_genai_config

    (out / "export.json").write_text(json.dumps(desc, indent=1))
    if desc.get("embed_file"):
        shutil.copyfile(Path(embed_dir) / desc["embed_file"], out / desc["embed_file"])
    shared = params.get("weight_sharing", True)
    if desc["embed"] == "part0":
        write_genai_config(
            desc,
            out / "genai_config.json",
            bundle_files(desc, "shared" if shared else ""),
            provider_options=provider_options(params["target"]),
        )


class GenieConfigRefused(UserError, ValueError):
    """Genie's parser (``GenieDialogConfig_createFromJson``) refused the bundle's genie_config.json."""


class GenieTokenizerMissing(UserError, ValueError):
    """The model's tokenizer cannot be written as ``tokenizer.json``, the one format Genie reads."""


def deep_merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, dicts key by key, anything else replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_genie(genie_desc: dict, tokenizer_dir: Path, out: Path, params: dict, ctx_bins: list[str]) -> dict:
    """Write ``genie_config.json`` (:func:`tasks.llm.genie.config.genie_config` naming ``ctx_bins``,
    with the recipe's ``bundle.genie_config`` merged over it), ``htp_backend_ext_config.json``
    (the target's SoC model and DSP arch) and ``tokenizer.json`` into ``out``, then run Genie's
    parser on the config. Returns the config. Raises :class:`GenieConfigRefused` in one line
    naming the file, Genie's status and its reason, :class:`GenieTokenizerMissing` when the
    export has no ``tokenizer.json`` (:func:`tasks.llm.export.write_tokenizer_json` says why)."""
    from tasks.llm.genie.config import genie_config, htp_backend_ext_config, parse_config

    sharing = params.get("weight_sharing", True)
    cfg = deep_merge(genie_config(genie_desc, ctx_bins), params.get("genie_config") or {})
    text = json.dumps(cfg, indent=1)
    (out / "genie_config.json").write_text(text + "\n")
    (out / "htp_backend_ext_config.json").write_text(
        json.dumps(htp_backend_ext_config(params["target"], sharing), indent=1) + "\n"
    )
    tok = Path(tokenizer_dir) / "tokenizer.json"
    if not tok.is_file():  # the export writes one from any tokenizer transformers converts (export.json says why not)
        from tasks.contract.common import TOKENIZER_FILES

        have = [n for n in TOKENIZER_FILES if (Path(tokenizer_dir) / n).is_file() and n != "config.json"]
        raise GenieTokenizerMissing(
            f"bundle.runtimes: expected a tokenizer.json for runtime genie (the one tokenizer "
            f"format Genie reads), found the model's tokenizer as {', '.join(have) or 'no files'}, "
            "which transformers converts to no fast tokenizer (tasks/llm/export.py "
            "write_tokenizer_json); drop genie from bundle.runtimes for this model"
        )
    shutil.copyfile(tok, out / "tokenizer.json")
    status, why = parse_config(text)
    if status != 0:
        merged = " (bundle.genie_config merged in)" if params.get("genie_config") else ""
        raise GenieConfigRefused(
            f"genie_config.json{merged}: expected a config Genie's parser "
            f"(GenieDialogConfig_createFromJson) accepts, found status {status}: {why}"
        )
    return cfg


def run(inputs, files, params, out: Path) -> dict:
    """Write the bundle's own files for ``params["parts"]`` parts from ``inputs["qdq.part{k}"]``
    (the quantized parts, whose ``export.json`` declares the graphs' I/O as compiled) and
    ``inputs["export.part{k}"]`` (the parts' exports: the host-side table, the tokenizer;
    ``inputs["compiled.part{k}"]`` are the parts' binaries, which ``build/`` links beside).
    Returns {"parts": P, "binary_bytes": total bytes of the parts' weight-shared (else
    per-graph) context binaries}."""
    P = params["parts"]
    desc = joined_description([inputs[f"qdq.part{k}"] for k in range(P)])
    write_genai_files(desc, inputs["export.part0"], out, params)
    sub = "shared" if params.get("weight_sharing", True) else ""
    total = sum(
        b.stat().st_size for k in range(P) for b in (Path(inputs[f"compiled.part{k}"]) / sub / f"part{k}").glob("*.bin")
    )
    info = {"parts": P, "binary_bytes": total}
    if "genie" in params.get("runtimes", ()):
        from tasks.llm.genie.binaries import check_binaries
        from tasks.llm.genie.config import config_binaries

        entries = [Path(inputs[f"genie.part{k}"]) for k in range(P)]
        gdesc = joined_genie_description(entries)  # each part's row from its own entry
        bins = genie_files(gdesc, params.get("weight_sharing", True))
        cfg = write_genie(gdesc, inputs["export.part0"], out, params, bins)
        # the binaries the config names, read back where they are (each part's entry; build/
        # links them beside the config)
        found = {}
        for rel, graphs in config_binaries(cfg, gdesc).items():
            where = next((e for e in entries if (e / rel).is_file()), entries[0])  # none: check_binaries says so
            found.update(check_binaries(where, {rel: graphs}, gdesc, params["target"]))
        info["genie"] = {"ctx_bins": bins, "binaries": found, "binary_bytes": sum(f["bytes"] for f in found.values())}
    return info


STAGE = Stage(
    kind="bundle",
    module=__name__,
    version=2,  # 2: export.json from the quantized parts
    tools=(),
    run=run,
    params=(WEIGHT_SHARING,),
    wired=("target", "parts", "runtimes", "genie_config"),
    key_exclude=("target",),  # the name; the key holds what it resolves to (key_extra)
    key_extra=target_key_extra,
    preflight=preflight,
    artifacts=("export.json", "genai_config.json", "*.npy", "genie_config.json", "htp_backend_ext_config.json"),
    memory_estimate=plan_estimate,
)
