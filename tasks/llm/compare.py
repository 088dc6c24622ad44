"""Greedy generation on a compiled LLM against its fp32 export: what the ``verify`` stage
(:mod:`tasks.llm.verify`) measures, on the parts' entries seen as whole-model folders.

For each verify prompt (the first ``samples`` lines of the recipe's data file) the compiled
model generates ``max_new_tokens`` tokens greedily through
:class:`tasks.llm.runner.LLMRunner`'s feeds (backend ``htp``: the per-graph context binaries on
QNN HTP, the simulator on x86_64; ``cpu-qdq``: the QDQ graphs on the CPU EP), then the fp32
export graphs on the CPU EP (equal to ``transformers`` ``generate()`` to 2e-4 in logits: tests)
are teacher-forced on the same prompt and the compiled side's tokens: at every position, the
token fp32 would pick after the same history. Both run part by part
(:class:`tasks.llm.runner.PartStream`): the teacher-forced fp32 side runs each prompt with
the compiled tokens through its prefill graphs, each loaded once, windows of S tokens, no
decode graph (the logits at each position are what fp32's decode graph would compute after
the same history, equal to fp32 rounding), whatever the number of tokens. Metrics
(``verify.json``):

- ``token_agreement``: share of generated positions where the compiled token equals fp32's
  greedy choice after the same history (mean over prompts). Up to and including the first
  difference this is the same comparison as two free-running greedy generations (the
  histories are equal there); after it, free-running compared continuations of two different
  texts (one near-tie flip and every later position could differ), where this compares the
  two models' next-token choices on the compiled model's text, the one it would emit;
- ``prefix_match_mean``: mean length of the common greedy prefix: the same figure as two
  free-running generations give (the first difference is found on equal histories);
- ``logits_cosine_mean`` / ``_min``: cosine of the last prefill position's logits [V];
- ``perplexity_ratio``: perplexity of the compiled model over a short text (teacher forced
  through the prefill graphs) divided by fp32's perplexity over the same tokens;
- ``reference_distinct_tokens`` per prompt: a continuation that repeats one token makes the
  agreement test unable to fail (a random-weight tiny LLM does: scripts/tiny_llm.py), so tests
  check it.

``runtime: genai`` (:mod:`tasks.llm.genai`): the compiled side's greedy tokens come from
onnxruntime-genai driving the same graphs through a ``genai_config.json`` (written to a temporary
folder, naming the per-graph binaries, or the QDQ graphs for ``cpu-qdq``); LLMRunner still runs
them too, and ``genai_runner_agreement`` is the share of prompts whose genai tokens equal
LLMRunner's (LLMRunner's cut before the first eos, where genai stops; token agreement then
compares genai's tokens with the fp32 tokens teacher-forced on LLMRunner's, cut the same way:
fp32's choices after genai's own history wherever genai and LLMRunner agree, which the
``genai_runner_agreement`` bar requires). The logits metrics and the
perplexity always come from LLMRunner (genai returns tokens). ``verify.json`` says which
runtime ran under ``"runtime"``.

``bundle.runtimes`` with ``genie`` (params ``runtimes``): every prompt is also generated through
Genie (``GenieDialog_tokenQuery``, libGenie.so, HTP simulator) on the ``genie_compile.part{k}``
per-graph binaries with the bundle's ``genie_config.json`` (:func:`_genie_generate`); per
sample ``genie_tokens``, ``genie_status``, ``genie_equals_runner``, and
``genie_runner_agreement``: the share of prompts whose Genie tokens equal LLMRunner's on the
genai binaries, both cut before the first eos. The read-back covers the Genie binaries too
(:func:`read_back_bundle`).

Shared (weight-shared) binaries: on x86_64 loading a context binary that holds two graphs
crashes the HTP simulator (reproduced by tasks/llm/htp.load_shared_probe),
so verify runs the per-graph binaries compiled from the same QDQ graphs (``verify.json``
``"ran"``). Before it runs anything, every binary, the shipped weight-shared ones included, is
read back (:func:`read_back_bundle`, ``tasks/qnn/context_binary.py``): its graphs, every input and
output against the export, the QDQ graphs and ``genai_config.json``, its SoC; its figures
(weight, shared weight, spill-fill and I/O bytes, SDK build id) go to ``verify.json``
``"binaries"``.
"""

from __future__ import annotations

from pathlib import Path

from tasks.proc import lazy

np = lazy.module("numpy")


def _prompts(files, params, tok) -> tuple[list[str], list[list[int]]]:
    from tasks.datafiles import read_lines

    texts = read_lines(files["data"], params["data"]["samples"])
    return texts, [tok(t)["input_ids"] for t in texts]


def read_back_bundle(views: dict, params: dict) -> dict:
    """Read back every context binary of the joined parts (``views["compiled"]``, the shipped
    weight-shared binaries and the per-graph ones) and check them against the export
    (``export.json``), the QDQ graphs (``views["qdq"]``), the SoC of ``params["target"]`` and
    the bundle's ``genai_config.json``: every model and tensor it names is in a binary, with the
    shapes genai feeds (:func:`tasks.llm.genai.declared_tensors`), and its QNN ``soc_model`` is
    the target's. Returns {binary: figures} (``tasks/qnn/context_binary.py``). Raises
    context_binary_checks.Mismatch, one line per difference."""
    import json

    from tasks.qnn import context_binary_checks
    from tasks.qnn.targets import get as get_target
    from tasks.llm.part_binaries import read_back
    from tasks.llm.genai import declared_tensors

    compiled = Path(views["compiled"])
    desc = json.loads((compiled / "export.json").read_text())
    parts = list(range(len(desc["parts"])))
    declared, somewhere, lines = {}, [], []
    config = Path(views["bundle"]) / "genai_config.json"
    if config.is_file():
        cfg = json.loads(config.read_text())
        declared, somewhere = declared_tensors(cfg)
        want = str(get_target(params["target"]).soc_model)
        for opts in cfg["model"]["decoder"].get("session_options", {}).get("provider_options", []):
            said = opts.get("qnn", {}).get("soc_model")
            if said is not None and str(said) != want:
                lines.append(
                    f"genai_config.json, provider_options qnn.soc_model: expected {want} "
                    f"({params['target']}), found {said}"
                )
    flags = {
        "target": params["target"],
        "per_graph": any((compiled / f"part{k}").is_dir() for k in parts),
        "weight_sharing": any((compiled / "shared" / f"part{k}").is_dir() for k in parts),
    }
    try:
        found = read_back(
            compiled, desc, parts, flags, qdq_dir=views.get("qdq"), declared=declared, somewhere=somewhere
        )
    except context_binary_checks.Mismatch as e:
        raise context_binary_checks.Mismatch(lines + e.lines) from None
    if lines:
        raise context_binary_checks.Mismatch(lines)
    if views.get("genie_parts"):  # the Genie binaries: what genie_config.json names, and the per-graph ones
        from tasks.llm.genie.binaries import check_binaries
        from tasks.llm.genie.config import config_binaries
        from tasks.llm.genie.names import joined_genie_description, planned_binaries

        entries = views["genie_parts"]
        gdesc = joined_genie_description(entries)  # each part's row from its own entry
        named = config_binaries(json.loads((Path(views["bundle"]) / "genie_config.json").read_text()), gdesc)
        for k, e in enumerate(entries):
            plan = {
                **planned_binaries(gdesc, k, flags["per_graph"], False),
                **{rel: g for rel, g in named.items() if (e / rel).is_file()},
            }
            found.update(check_binaries(e, plan, gdesc, params["target"]))
        missing = [rel for rel in named if not any((e / rel).is_file() for e in entries)]
        if missing:
            raise context_binary_checks.Mismatch(
                [f"{rel}: named by genie_config.json ctx-bins, found in no genie_compile entry" for rel in missing]
            )
    return found


#: bytes a session holds per byte of its graph's files, for the compiled side's residency
#: (:func:`resident_bytes`): ``cpu-qdq`` sessions (:func:`tasks.llm.qdq_session.qdq_session`)
#: measured at 2.2 after creation and 3.2 while made (a Qwen2.5-7B part's 0.93 GiB decode graph:
#: 2.1 and 3.0 GiB); ``htp`` sessions: 2, the rule before this one (decode graphs within half
#: the memory available)
SESSION_BYTES_PER_FILE_BYTE = {"cpu-qdq": 2.5, "htp": 2.0}


def resident_bytes(graph_path, parts: int, backend: str, prompts: int, desc: dict) -> int:
    """Bytes the compiled side's greedy generation (:meth:`tasks.llm.runner.PartStream.run`)
    holds when every part's decode session stays open: each decode graph's files on disk
    (``graph_path(i, "decode")`` and the files beside it whose names start with its stem, its
    external data or context binary) x :data:`SESSION_BYTES_PER_FILE_BYTE` of ``backend``,
    plus the KV caches of ``prompts`` prompts (each decode graph's KV inputs, one buffer per
    layer and K/V, [1, KV heads, context, head_dim] at the dtype ``desc`` declares: the bundle's
    ``export.json``, 1 byte per element for a uint8 cache, 4 for float32). The prefill sessions
    come before, one at a time."""
    from tasks.llm.boundary import kv_cache

    total = 0
    for i in range(parts):
        g = Path(graph_path(i, "decode"))
        total += sum(f.stat().st_size for f in g.parent.iterdir() if f.name.startswith(g.stem))
    kv = prompts * sum(
        int(np.prod(t["shape"])) * np.dtype(t["dtype"]).itemsize
        for p in desc["parts"]
        for t in p["decode"]["inputs"]
        if kv_cache(t["name"])
    )
    return int(total * SESSION_BYTES_PER_FILE_BYTE[backend]) + kv


def resident_parts(need: int, parts: int, budget_bytes: int | None) -> int:
    """How many parts' sessions the compiled side keeps open: all of them when ``need``
    (:func:`resident_bytes`) fits in ``budget_bytes``, so each decode graph is loaded once;
    else 1 (one part at a time, each decode graph loaded once per generated token). ``None``
    budget: 1."""
    return parts if budget_bytes is not None and need <= budget_bytes else 1


def _cut_at_eos(tokens: list[int], eos) -> list[int]:
    """``tokens`` before the first ``eos``: genai stops there and leaves eos out of the sequence
    (measured with onnxruntime-genai 0.18.0: a continuation whose 7th token is eos comes back
    as 6 tokens)."""
    return tokens[: tokens.index(eos)] if eos is not None and eos in tokens else list(tokens)


def _genai_version() -> str:
    import onnxruntime_genai as og

    return og.__version__


def _genai_generate(desc: dict, inputs: dict, params: dict, prompts: list[list[int]], K: int) -> list[list[int]]:
    """Greedy tokens of every prompt through onnxruntime-genai on the compiled side: the
    per-graph context binaries on QNN HTP (``backend: htp``; every node on HTP, as
    ``session.disable_cpu_ep_fallback=1`` makes session creation fail otherwise) or the QDQ
    graphs on the CPU EP (``cpu-qdq``). The ``genai_config.json`` goes to a temporary folder
    (cache entries are read-only) whose ``part{i}`` are links to the graphs' folders (genai
    takes only relative paths). genai holds every part's sessions at once, in a child process
    (:func:`tasks.llm.genai.generate_in_child`)."""
    import tempfile

    from tasks.qnn import ep as _qnn
    from tasks.llm.genai import bundle_files, generate_in_child, link_parts, write_genai_config

    with tempfile.TemporaryDirectory(prefix="npubuild-genai-") as tmp:
        if params["backend"] == "htp":
            link_parts(desc, inputs["compiled"], tmp)
            write_genai_config(
                desc,
                Path(tmp) / "genai_config.json",
                bundle_files(desc),
                provider_options=_qnn.provider_options(params["target"]),
                session_config={"session.disable_cpu_ep_fallback": "1"},
            )
        else:
            link_parts(desc, inputs["qdq"], tmp)
            write_genai_config(desc, Path(tmp) / "genai_config.json", bundle_files(desc, suffix=".onnx"))
        return generate_in_child(tmp, prompts, K, qnn=params["backend"] == "htp")


def _genie_generate(inputs: dict, prompts: list[list[int]], K: int) -> dict:
    """Greedy tokens of every prompt through Genie on the HTP simulator
    (:func:`tasks.qnn.libgenie.generate_in_child`): the bundle's ``genie_config.json`` with its
    ``ctx-bins`` turned to the per-graph binaries (the simulator cannot load a two-graph
    binary: Genie on the shipped ``qwen2_part_1_of_1.bin`` ended with SIGSEGV, exit -11, as
    onnxruntime does on the genai shared binaries), in a temporary folder whose ``genie/part{k}`` link to the
    ``genie_compile.part{k}`` entries (the bytes that ship without weight sharing, names patched as shipped), beside the
    bundle's ``htp_backend_ext_config.json`` and ``tokenizer.json``. The shipped config carries
    the device's engine settings; this copy gets the simulator's
    (:data:`tasks.llm.genie.config.SIMULATOR_SETTINGS`: poll false), nothing else changed."""
    import json
    import os
    import tempfile

    from tasks.llm.genie.config import SIMULATOR_SETTINGS, with_settings
    from tasks.llm.genie.names import genie_files, joined_genie_description
    from tasks.qnn.libgenie import generate_in_child

    entries, bundle = inputs["genie_parts"], Path(inputs["bundle"])
    desc = joined_genie_description(entries)  # each part's row from its own entry
    cfg = with_settings(json.loads((bundle / "genie_config.json").read_text()), SIMULATOR_SETTINGS)
    cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = genie_files(desc, False)
    with tempfile.TemporaryDirectory(prefix="npubuild-genie-") as tmp:
        (Path(tmp) / "genie").mkdir()
        for k, e in enumerate(entries):
            os.symlink(e / "genie" / f"part{k}", Path(tmp) / "genie" / f"part{k}", target_is_directory=True)
        for f in ("htp_backend_ext_config.json", "tokenizer.json"):
            os.symlink(bundle / f, Path(tmp) / f)
        (Path(tmp) / "genie_config.json").write_text(json.dumps(cfg, indent=1))
        return generate_in_child(
            tmp,
            prompts,
            K,
            what="the bundle's genie_config.json (verify: per-graph binaries, the simulator's settings)",
        )


def verify_llm(
    inputs: dict,
    files: dict,
    params: dict,
    budget_bytes: int | None = None,
    wrap_sessions=None,
    resident: int | None = None,
) -> dict:
    """Measure the compiled LLM against the fp32 export (see module docstring). Both sides run
    as :class:`tasks.llm.runner.PartStream` over every verify prompt at once, one side after
    the other: the compiled side generates greedily (each part's prefill graph loaded once,
    its decode graph once when what holding them all takes fits ``budget_bytes``, bytes:
    :func:`resident_bytes`, else once per token), then the fp32 side is teacher-forced on the
    compiled side's tokens, one part at a time (each prefill graph loaded once, no decode
    graph); perplexity's text goes through the prefill graphs in the same passes. ``resident``:
    the compiled side's open parts, decided by the stage (:func:`tasks.llm.verify_memory.memory_plan`);
    it overrides ``budget_bytes``. onnxruntime-genai and Genie, which hold every part at once,
    run first, each in a child process, while this process holds the least. The fp32 side is the exported fp32
    graphs on the CPU EP (tests tie them to ``transformers``: tests/llm/test_runner.py). ``wrap_sessions``:
    optional ``factory -> factory`` put around both sides' session factories (tests count
    the sessions made). Returns the report dict (``"_run"``: how many parts each side held,
    the sessions each made and its wall seconds)."""
    import json
    import time

    from transformers import AutoTokenizer

    from tasks.qnn import ep as qnn
    from tasks.metrics import agreement, cosine, perplexity
    from tasks.proc.scrubbing import scrub
    from tasks.llm import htp
    from tasks.llm.runner import PartStream
    from tasks.llm.qdq_session import qdq_session
    from tasks.llm.sessions import cpu_session

    from tasks.proc import tree

    meter = tree.current() or tree.measure()  # each runtime's peak apart ("memory_phases")
    with meter.phase("read_back"):
        binaries = read_back_bundle(inputs, params)  # what ships, read back before anything runs
    model_dir, ref_dir = inputs["source"], Path(inputs["reference"])
    desc = json.loads((ref_dir / "export.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    texts, prompts = _prompts(files, params, tok)
    K = params["max_new_tokens"]
    embed = np.load(ref_dir / desc["embed_file"], mmap_mode="r") if desc.get("embed_file") else None
    pad = desc["pad_token_id"]  # what genai pads with; pad rows never reach a real token's result
    wrap = wrap_sessions or (lambda f: f)

    def stream(folder: Path, suffix: str, make_session, resident=None) -> PartStream:
        def path(i, kind):
            rel = desc["parts"][i][kind]["path"]
            return folder / (rel[: -len(".onnx")] + suffix)

        if resident is None:
            need = resident_bytes(path, len(desc["parts"]), params["backend"], len(prompts), desc)
            resident = resident_parts(need, len(desc["parts"]), budget_bytes)
        return PartStream(desc, path, wrap(make_session), resident=resident, embed_table=embed, pad_id=pad)

    runtime = params.get("runtime", "runner")
    # the runtimes that hold every part at once run first, each in a child process, while this
    # process holds the least (what the memory plan counts: tasks.llm.verify_memory.verify_phases)
    genai_tokens = got_genie = None
    if runtime == "genai":
        with meter.phase("genai"):
            genai_tokens = _genai_generate(desc, inputs, params, prompts, K)
    if "genie" in params.get("runtimes", ()):
        with meter.phase("genie"):
            got_genie = _genie_generate(inputs, prompts, K)
    if params["backend"] == "htp":
        got = stream(Path(inputs["compiled"]), "_ctx.onnx", htp.qnn_session_factory(target=params["target"]), resident)
        ran = "per-graph context binaries compiled from the same QDQ graphs (the shared binary crashes the simulator)"
    else:
        got = stream(Path(inputs["qdq"]), ".onnx", qdq_session, resident)
        ran = "QDQ graphs on the CPU EP (quantization only; weight MatMuls fused, fp32)"
    ids = None  # perplexity's text: teacher forced through the prefill graphs in the same pass
    if "perplexity_text" in files:
        ids = tok(Path(files["perplexity_text"]).read_text(encoding="utf-8"))["input_ids"]
        ids = ids[: min(len(ids), desc["context_len"] - 1, 64)]
    t0 = time.perf_counter()
    with meter.phase("compiled"):
        got_tokens, got_logits, *got_rows = got.run(
            prompts, K, score=ids, progress=f"{params['backend']} steps ({len(prompts)} prompts)"
        )
        got.close()  # one side's sessions at a time
    t1 = time.perf_counter()
    fp32 = stream(ref_dir, ".onnx", cpu_session, resident=1)  # part-major: one part at a time costs no loads
    with meter.phase("reference"):
        ref_tokens, ref_logits, *ref_rows = fp32.run(
            prompts,
            K,
            forced=[t[:-1] for t in got_tokens],
            score=ids,
            progress=f"fp32 graphs ({len(prompts)} prompts, teacher forced)",
        )
        fp32.close()
    seconds = {"compiled": round(t1 - t0, 1), "reference": round(time.perf_counter() - t1, 1)}
    rows = []
    for txt, rt, rl, gt, gl in zip(texts, ref_tokens, ref_logits, got_tokens, got_logits):
        frac, pre = agreement(rt, gt)
        rows.append(
            {
                "text": scrub(txt),
                "token_agreement": frac,
                "prefix_match": pre,
                "logits_cosine": cosine(gl[0], rl[0]),
                "tokens": gt,
                "reference": rt,
                "reference_distinct_tokens": len(set(rt)),
            }
        )
    cos = [r["logits_cosine"] for r in rows]
    metrics = {
        "token_agreement": float(np.mean([r["token_agreement"] for r in rows])),
        "prefix_match_mean": float(np.mean([r["prefix_match"] for r in rows])),
        "logits_cosine_mean": float(np.mean(cos)),
        "logits_cosine_min": float(np.min(cos)),
    }
    if ids is not None:
        p_c, p_r = perplexity(got_rows[0], ids[1:]), perplexity(ref_rows[0], ids[1:])
        metrics.update(perplexity=p_c, perplexity_fp32=p_r, perplexity_ratio=p_c / p_r, perplexity_tokens=len(ids) - 1)
    if runtime == "genai":
        eos = desc.get("eos_token_id")
        same = []
        for r, gt, rt in zip(rows, genai_tokens, got_tokens):
            runner_cut = _cut_at_eos(rt, eos)
            same.append(gt == runner_cut)
            frac, pre = agreement(_cut_at_eos(r["reference"], eos), gt)
            r.update(
                tokens=gt,
                runner_tokens=rt,
                genai_equals_runner=gt == runner_cut,
                token_agreement=frac,
                prefix_match=pre,
            )
        metrics.update(
            token_agreement=float(np.mean([r["token_agreement"] for r in rows])),
            prefix_match_mean=float(np.mean([r["prefix_match"] for r in rows])),
            genai_runner_agreement=float(np.mean(same)),
        )
        ran += "; tokens generated by onnxruntime-genai " + _genai_version()
    if got_genie is not None:
        from tasks.llm.genie.config import SIMULATOR_SETTINGS

        eos = desc.get("eos_token_id")
        same = []
        for r, gt, rt, st in zip(rows, got_genie["tokens"], got_tokens, got_genie["status"]):
            ok = _cut_at_eos(gt, eos) == _cut_at_eos(rt, eos)
            same.append(ok)
            r.update(genie_tokens=gt, genie_status=st, genie_equals_runner=ok)
        metrics["genie_runner_agreement"] = float(np.mean(same))
        ran += (
            "; Genie (libGenie.so, GenieDialog_tokenQuery) on the per-graph Genie binaries with the shipped "
            "genie_config.json's settings but "
            + ", ".join(f"{k} {json.dumps(v)}" for k, v in SIMULATOR_SETTINGS.items())
            + " (the simulator's), compared with LLMRunner's tokens on the genai binaries"
        )
    return {
        "backend": params["backend"],
        "target": params["target"],
        "ran": ran,
        "metrics": metrics,
        "runtime": runtime,
        "samples": rows,
        "max_new_tokens": K,
        "reference": "fp32 export graphs (CPU EP), teacher-forced on the compiled side's tokens (prefill graphs)",
        # how it ran on this machine (manifest info, not verify.json: it varies with memory)
        "_run": {
            "parts_resident": {"reference": fp32.resident, "compiled": got.resident},
            "part_loads": {"reference": fp32.loads, "compiled": got.loads},
            "seconds": seconds,
            "memory_phases": {k: v for k, v in meter.phases.items()},
        },
        "binaries": binaries,
        # where the compiled graphs run, read from every part's compile entry
        **qnn.placement(*inputs.get("compiled_parts", [inputs["compiled"]])),
    }
