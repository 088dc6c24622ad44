"""The bundle's ``README.md`` (:func:`model_card`): a ``huggingface_hub.ModelCard`` made from
the recipe, its catalog row (:mod:`tasks.core.row`) and the shipped files: what it is and its
state, how to run it (:mod:`.usage`: snippets, inputs and outputs, runtime versions), what
verify measured against which bars, the device figures, the files and how to check them."""

from __future__ import annotations

from tasks.core.row import arch, label


def _ran(v: dict) -> str:
    """A verify result's backend, with the LLM runtime that generated (``htp, genai``)."""
    return f"{v['backend']}, {v['runtime']}" if v.get("runtime") else v["backend"]


def _device_lines(row: dict) -> list[str]:
    """The card's "On the device" section: per target and runtime layout, what the shipped
    binaries hold and move (:func:`tasks.llm.figures.device_figures`: read back once built,
    else estimated), and the decode ceiling; [] without device figures (encoders)."""
    dev = row.get("device") or {}
    if not dev:
        return []

    def gb(b):
        return (
            "unknown"
            if b is None
            else f"{b / 1e9:.3f} GB"
            if b >= 1e9
            else f"{b / 1e6:.2f} MB"
            if b >= 1e6
            else f"{b / 1e3:.1f} kB"
        )

    out = [
        "",
        "## On the device",
        "",
        "Per runtime layout: the KV cache's type at the graphs' boundary, memory (weights + KV cache + "
        "spill-fill + I/O buffers; the runtime's own is not included), and bytes moved per decoded token "
        "(weights read + what the decode graphs read and write). The ceiling is DRAM bandwidth / bytes "
        "moved: a bound, not a measurement.",
        "",
        "| target | runtime | KV cache | memory | read per token | written per token | x weights | decode ceiling "
        "| from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target, f in sorted(dev.items()):
        for rt, r in (f.get("runtimes") or {}).items():
            tps = r.get("decode_tokens_per_s_ceiling")
            out.append(
                f"| {target} | {rt} | {gb(r['kv_cache_bytes'])} {r['kv_dtype']} at {r['context_length']} | "
                f"{gb(r['memory_bytes'])} | {gb(r['weight_bytes_read_per_token'] + r['io_bytes_read_per_token'])} | "
                f"{gb(r['io_bytes_written_per_token'])} | {r['bytes_per_token_over_weights']:.3f} | "
                f"{'unknown' if tps is None else f'{tps:.1f} tokens/s'} | {r['bundle_bytes_from']} |"
            )
    genai = [(t, f["runtimes"]["genai"]) for t, f in sorted(dev.items()) if "genai" in (f.get("runtimes") or {})]
    if genai:
        t, r = genai[0]
        out += [
            "",
            f"genai rewrites the whole KV cache every call: onnxruntime-genai 0.18.0 gives a pipeline model no "
            f"new-slots-only cache (its windowed cache is for single models), so each decoded token writes "
            f"{gb(r['kv_bytes_written_per_token'])} of KV ({t})"
            + (
                ", where Genie, which keeps the cache, writes one slot per layer."
                if "genie" in (dev[t].get("runtimes") or {})
                else "."
            ),
        ]
    left = [
        (t, rt, f)
        for t, v in sorted((row.get("verify") or {}).items())
        for rt, b in sorted((v.get("boundary") or {}).items())
        for f in b.get("float32", [])
    ]
    if left:
        out += [
            "",
            "Tensors left float32 at a shipped graph's boundary (the rest cross as integers; verify.json `boundary`):",
            "",
            "| target | runtime | binary | tensor | shape | why |",
            "|---|---|---|---|---|---|",
            *(f"| {t} | {rt} | {f['binary']} | `{f['tensor']}` | {f['shape']} | {f['why']} |" for t, rt, f in left),
        ]
    return out


def _io_lines(io: dict | None) -> list[str]:
    """The card's "How to run it" section, from the export's ``io.json`` (a graph built from an
    ONNX file: its inputs and outputs, the preprocessing or the stream a caller must give it, how
    its output is read); [] without one."""
    if not io:
        return []
    out = [
        "",
        "## How to run it",
        "",
        "Load `model_ctx.onnx` with onnxruntime's QNN EP (HTP). Its inputs and outputs (`io.json` holds this too):",
        "",
        "| | name | dtype | shape |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {side[:-1]} | `{t['name']}` | {t['dtype']} | {t['shape']} |"
        for side in ("inputs", "outputs")
        for t in io.get(side, [])
    ]
    if pre := io.get("preprocess"):
        H, W = pre["size"]
        how = (
            f"scale to {H} px high keeping the aspect ratio (at most {W} wide), pad the width on the right with "
            f"{pre.get('pad', 0.0)} after normalising"
            if pre["resize"] == "height"
            else f"scale to fit {H} x {W} keeping the aspect ratio, top-left on a white canvas"
        )
        out += [
            "",
            f"Preprocessing: an RGB image, {how}; channels in {pre['colour']} order; x / 255, minus mean "
            f"{pre['mean']}, over std {pre['std']}; NCHW, batch 1.",
        ]
    if st := io.get("stream"):
        out += [
            "",
            f"Stream: mono float audio at {st['rate']} Hz in [-1, 1], one call per {st['frame']} new samples "
            f"with the {st['context']} samples before them in front (`{st['input']}`: [1, "
            f"{st['context'] + st['frame']}]); "
            + "; ".join(
                f"`{i}` starts at zeros and takes the previous call's `{o}`"
                for i, o in sorted(st.get("recurrent", {}).items())
            )
            + ".",
        ]
    if io.get("decoding"):
        out += [
            "",
            f"Reading the output: {io['decoding']}"
            + (f" (`metadata.json`: {', '.join(io['metadata'])})." if io.get("metadata") else "."),
        ]
    return out


def _files_lines(loaded: dict[str, list[str]]) -> list[str]:
    """The card's "Files" section: every file the bundle holds and who loads it (``loaded``:
    :func:`.contents.shipped_files`, the rule of what ships, plus :data:`.contents.WRITTEN`), one
    table row per file: ``| `path` | who; who |``."""
    from tasks.commands.publish.contents import WRITTEN
    from tasks.commands.publish.signing import SIGNATURE

    rows = {**loaded, **{rel: [who] for rel, who in WRITTEN.items()}}
    return [
        "",
        "## Files",
        "",
        "Every file here and what loads it: onnxruntime-genai opens `genai_config.json`, Genie "
        "`genie_config.json`, each naming its models or binaries; onnxruntime's QNN EP an encoder's "
        "`*_ctx.onnx`, which names its context binary. Nothing else is shipped: the per-graph binaries an "
        "LLM's verify runs on the simulator beside weight-shared ones stay in the build. "
        f"A signed bundle also holds `{SIGNATURE}`.",
        "",
        "| file | loaded by |",
        "|---|---|",
        *(f"| `{rel}` | {'; '.join(who)} |" for rel, who in sorted(rows.items())),
    ]


def _state_line(state: str, row: dict) -> str:
    """The card's first sentence after the description: the recipe's state and what it means."""
    bars = sorted({n for v in (row["verify"] or {}).values() for n in v["thresholds"]})
    if state == "verified":
        return (
            f"**State: verified.** Every verify figure with a bar met it ({', '.join(f'`{b}`' for b in bars)}; "
            f"the table under Verification)."
        )
    return (
        f"**State: {label(state)}.** Verify ran and measured the figures under Verification, but the recipe "
        f"sets no bar (`verify.thresholds` empty), so nothing judged them: this bundle is not verified."
    )


def model_card(
    recipe,
    row: dict,
    short: str,
    loaded: dict[str, list[str]] | None = None,
    files: dict | None = None,
    tools: dict[str, str] | None = None,
) -> str:
    """The bundle's README.md: a ``huggingface_hub.ModelCard`` (YAML metadata: license,
    library, tags, base model for Hub sources, eval results = verify metrics) and a body with
    the state (``row["state"]``: verified or built (no bars)), the source, how to run it
    (:func:`.usage.usage_lines`, from ``files``: {bundle path: file} of what ships, and
    ``tools``: {tool: version} the stage entries recorded), the verify metrics against their
    thresholds, the device figures, the files, how to check them (:func:`.usage.check_lines`)
    and the stage keys. ``loaded``: {bundle path: who loads it} of the shipped artifacts
    (:func:`.contents.shipped_files`), listed under "Files" (none: no such section)."""
    from tasks.commands.publish.usage import check_lines, usage_lines

    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    src = row["source"]
    evals = []
    for target, v in sorted(row["verify"].items()):
        for name, val in sorted(v["metrics"].items()):
            if isinstance(val, (int, float)):
                evals.append(
                    EvalResult(
                        task_type=recipe.task,
                        dataset_type="npubuild-verify",
                        dataset_name=f"{recipe.verify.data.file} ({target}, {_ran(v)})",
                        metric_type=name,
                        metric_value=round(float(val), 6),
                    )
                )
    data = ModelCardData(
        license=recipe.license,
        library_name="onnxruntime",
        pipeline_tag=recipe.task,
        model_name=recipe.name,
        base_model=src.get("repo"),
        eval_results=evals or None,
        tags=[
            "onnx",
            "qnn",
            "qualcomm",
            *(["npu"] if row.get("runs_on") == "npu" else ["npu+cpu"]),
            "npubuild",
            recipe.quantize.precision,
            *recipe.compile.targets,
        ],
    )
    if src["kind"] == "hf":
        origin = f"[{src['repo']}](https://huggingface.co/{src['repo']}) at commit `{src.get('commit')}`"
    elif src["kind"] == "shape":
        origin = (
            f"**random weights** in the exact configuration of [{src['repo']}](https://huggingface.co/{src['repo']}) "
            f"at commit `{src.get('revision')}` (a shape build: its verify figures are not the model's quality)"
        )
    elif src["kind"] == "package" and src.get("file"):
        origin = f"the file `{src['file']}` of the Python package `{src['package']}` {src.get('package_version', '')}"
    elif src["kind"] == "package":
        origin = (
            f"the Python package `{src['package']}` {src.get('package_version', '')} (folder `{src.get('subdir', '')}`)"
        )
    else:
        kind = "file" if str(src["path"]).endswith(".onnx") else "folder"
        origin = f"the local {kind} `{src['path']}` (content xxh3 `{src.get('content_digest')}`)"
    lines = [
        "---",
        data.to_yaml(),
        "---",
        "",
        f"# {recipe.name}",
        "",
        recipe.description or "",
        "",
        _state_line(row["state"], row),
        "",
        f"Built by npubuild from {origin}, quantized {recipe.quantize.precision} and compiled to QNN context "
        f"binaries for {', '.join(recipe.compile.targets)} (onnxruntime QNN EP, EPContext models). "
        f"Build key `{short}`. License: {row.get('license', recipe.license)}.",
        "",
        (
            "Every node of the compiled graphs runs on the NPU (QNN HTP)."
            if row.get("runs_on") == "npu"
            else f"Not every node runs on the NPU: {row.get('runs_on')} (the recipe allows CPU fallback: "
            f"`compile.disable_cpu_ep_fallback: false`)."
        ),
        "",
        "| | |",
        "|---|---|",
        f"| architecture | {arch(row)} |",
        f"| parameters | {row['parameters']} |",
        *([f"| sequence length | {row['sequence_length']} |"] if row["sequence_length"] else []),
        *([f"| context length | {row['context_length']} |"] if row["context_length"] else []),
        *(usage_lines(recipe, files, tools or {}, row.get("qnn_context_sdk") or []) if files is not None else []),
        "",
        "## Verification",
        "",
        "| target | backend (runtime) | metric | value | threshold |",
        "|---|---|---|---|---|",
    ]
    for target, v in sorted(row["verify"].items()):
        for name, val in sorted(v["metrics"].items()):
            bar = v["thresholds"].get(name)
            shown = f"{val:.6f}" if isinstance(val, float) else str(val)
            lines.append(f"| {target} | {_ran(v)} | {name} | {shown} | {'' if bar is None else bar} |")
    lines += [
        "",
        "## Checked before shipping",
        "",
        "What ran here (on the x86_64 HTP simulator or the CPU) and what was only read back. No speed "
        "figure comes from the simulator, and nothing here loads a weight-shared binary: a device does.",
        "",
    ]
    for target, v in sorted(row["verify"].items()):
        for rt, how in v.get("runtimes", {}).items():
            lines.append(f"- {target}, {rt}: {how}.")
    lines += [
        "",
        "Context binaries as read back by libQnnSystem (bytes; *weights*: each graph's own, summed; "
        "*shared weights*: what the graphs of a weight-shared binary hold once between them):",
        "",
        "| target | binary | graphs | size | weights | shared weights | spill-fill | I/O | QNN SDK |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target, v in sorted(row["verify"].items()):
        for rel, b in sorted(v.get("binaries", {}).items()):
            gs = b["graphs"].values()

            def total(k, gs=gs):
                return sum(g[k] or 0 for g in gs)

            unshipped = loaded is not None and rel not in loaded and f"{target}/{rel}" not in loaded
            lines.append(
                f"| {target} | {rel}{' (verify ran it; not shipped)' if unshipped else ''} | "
                f"{len(b['graphs'])} | {b['bytes']} | {total('weight_bytes')} | "
                f"{max((g['shared_weight_bytes'] or 0 for g in gs), default=0)} | "
                f"{max((g['spill_fill_bytes'] or 0 for g in gs), default=0)} | {total('io_bytes')} | "
                f"{b['sdk_build_id']} |"
            )
    lines += _io_lines(row.get("io"))
    lines += _device_lines(row)
    lines += _files_lines(loaded) if loaded is not None else []
    lines += check_lines()
    lines += [
        "",
        "## Stage keys",
        "",
        "| stage | key |",
        "|---|---|",
        *(f"| {s} | `{k}` |" for s, k in row["stage_keys"].items()),
        "",
    ]
    return str(ModelCard("\n".join(lines)))
