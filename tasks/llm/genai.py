"""onnxruntime-genai for our LLM bundles: ``genai_config.json`` and greedy generation through genai.

The exported graphs (:mod:`tasks.llm.export`) take what onnxruntime-genai's decoder pipeline
feeds a static-shape graph, so genai drives the compiled bundle itself. What the config says and
where genai reads it (onnxruntime-genai ``src/``; behaviour checked against the 0.18.0 wheel):

- ``model.type = "decoder-pipeline"`` -> ``DecoderOnlyPipelineModel``
  (``models/decoder_only_pipeline.cpp``): one session per ``pipeline`` entry, all created when
  the model loads, run in order; a stage's non-managed outputs (``hidden_states_{i}``) are
  handed to later stages by name. Per part: ``part{i}_context`` (our prefill graph,
  ``run_on_prompt`` only) and ``part{i}_iterator`` (our decode graph, ``run_on_token_gen`` only).
- ``decoder.sliding_window`` {``window_size`` = S, ``alignment: "left"``,
  ``slide_key_value_cache: false``}: the prompt is padded at its end to a multiple of S
  (``generators.cpp``) and fed S tokens at a time (``models/input_ids.cpp`` ``WindowedInputIDs``,
  which also feeds ``past_sequence_length`` [1, 1] / ``total_sequence_length`` [1] int32 when
  the graphs take both; their names are mapped to ``past_seq_len`` / ``total_seq_len``, Olive's
  names). Padded tokens are recognised by ``pad_token_id``, so a prompt must not contain it.
- KV: a fixed KV length in the graphs makes ``DefaultKeyValueCache`` share one past/present
  buffer per layer (``models/kv_cache.cpp``: "auto-detected fixed kv-cache seq_len"), which the
  graphs update in place. onnxruntime-genai 0.18.0 never gives a *pipeline* model its sliding
  ``WindowedKeyValueCache`` (the one that would take new-only K/V outputs): measured with gdb,
  ``UsesNonRewindableWindowedKeyValueCache`` returns false because
  ``CanUseTopLevelDeviceKeyValueCachePolicy`` requires ``decoder.pipeline`` to be empty.
- ``decoder.session_options.provider_options``: ``[{"qnn": {...}}]`` (genai maps "qnn" to its
  QNN provider, adds ``ep.share_ep_contexts=1`` and appends the plugin EP's devices when the
  library was registered, ``qnn/session_options.cpp``); other keys of ``session_options``
  become session config entries (``config.cpp`` ``SessionOptions_Element``). With no provider
  options (the CPU EP: ``verify.backend: cpu-qdq``) they are :data:`tasks.llm.sessions.CPU_CONFIG`,
  LLMRunner's: with onnxruntime's defaults genai computed a QDQ graph's weight MatMuls with
  int8-quantized activations (fused ``MatMulNBits``, accuracy level 4) and LLMRunner in fp32,
  1e-2 apart in logits, which flipped near ties (a random Phi-3: genai = LLMRunner on 5 of 6
  prompts; with these entries the two give the same logits, bit for bit).
- ``logits`` [1, S, V] of the prefill graph: genai takes the row of the last real token
  (``models/logits.cpp``).
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.errors import InputError

GRAPHS = {"prefill": "context", "decode": "iterator"}
_REGISTERED = False


def stage_name(part: int, graph: str) -> str:
    """The pipeline entry name of a part's graph: ``part{i}_context`` / ``part{i}_iterator``."""
    return f"part{part}_{GRAPHS[graph]}"


def genai_config(
    desc: dict, model_files: dict, *, provider_options: dict | None = None, session_config: dict | None = None
) -> dict:
    """The ``genai_config.json`` dict of an export description (``export.json``).

    Args:
        desc: the export description; needs the windowed I/O layout (``io_layout``), part 0
            with ``input_ids`` (``embed="part0"``) and ``eos_token_id``/``pad_token_id``.
        model_files: {stage name (:func:`stage_name`): graph path, relative to the config's
            folder}, one for every part's prefill and decode graph.
        provider_options: QNN provider options (strings), or None for the CPU EP.
        session_config: extra session config entries (e.g. ``session.disable_cpu_ep_fallback``);
            with ``provider_options=None`` they go over :data:`tasks.llm.sessions.CPU_CONFIG`.

    Raises ValueError for an export genai cannot drive (separate embedding table; an old
    layout; C not a multiple of S, since padded prompt windows must fit the cache).
    """
    from tasks.llm.layout import IO_LAYOUT

    if desc.get("io_layout") != IO_LAYOUT:
        raise ValueError(f"export layout {desc.get('io_layout')!r} is not genai's windowed layout; re-export")
    if desc["embed"] != "part0":
        raise ValueError("embed='separate' needs a host-side lookup; genai's pipeline here starts from input_ids")
    S, C = desc["seq_len"], desc["context_len"]
    if C % S:
        raise InputError(f"context_length {C} must be a multiple of the prefill length {S} for genai's windows")
    pipeline = []
    for p in desc["parts"]:
        for g in ("prefill", "decode"):
            name = stage_name(p["index"], g)
            pipeline.append(
                {
                    name: {
                        "filename": str(model_files[name]),
                        "inputs": [i["name"] for i in p[g]["inputs"]],
                        "outputs": [o["name"] for o in p[g]["outputs"]],
                        "run_on_prompt": g == "prefill",
                        "run_on_token_gen": g == "decode",
                    }
                }
            )
    from tasks.llm.sessions import CPU_CONFIG

    base = CPU_CONFIG if provider_options is None else {}  # the CPU EP computes as LLMRunner's sessions
    so = {"log_id": "npubuild", **{k: str(v) for k, v in {**base, **(session_config or {})}.items()}}
    if provider_options is not None:
        so["provider_options"] = [{"qnn": {k: str(v) for k, v in provider_options.items()}}]
    return {
        "model": {
            "type": "decoder-pipeline",
            "context_length": C,
            "vocab_size": desc["vocab_size"],
            "eos_token_id": desc["eos_token_id"],
            "pad_token_id": desc["pad_token_id"],
            "bos_token_id": desc.get("bos_token_id", desc["eos_token_id"]),
            "decoder": {
                "session_options": so,
                "head_size": desc["head_dim"],
                "hidden_size": desc["hidden_size"],
                "num_attention_heads": desc["num_heads"],
                "num_key_value_heads": desc["num_kv_heads"],
                "num_hidden_layers": desc["num_layers"],
                "inputs": {
                    "input_ids": "input_ids",
                    "past_sequence_length": "past_seq_len",
                    "total_sequence_length": "total_seq_len",
                    "past_key_names": "past_key_%d",
                    "past_value_names": "past_value_%d",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present_key_%d",
                    "present_value_names": "present_value_%d",
                },
                "sliding_window": {
                    "window_size": S,
                    "pad_value": 0,
                    "alignment": "left",
                    "slide_key_value_cache": False,
                    "slide_inputs": True,
                },
                "pipeline": pipeline,
            },
        },
        "search": {
            "do_sample": False,
            "max_length": C,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "top_k": 1,
            "top_p": 1.0,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
        },
    }


def bundle_files(desc: dict, folder: str = "", suffix: str = "_ctx.onnx") -> dict:
    """{stage name: ``<folder>/part{i}/<graph><suffix>``} (the compile stage's layout). genai
    0.18.0 takes only paths relative to the config's folder ("Config path must be a relative
    path under the model directory"); see :func:`link_parts` for graphs elsewhere."""
    out = {}
    for p in desc["parts"]:
        for g in ("prefill", "decode"):
            rel = p[g]["path"]
            out[stage_name(p["index"], g)] = str(Path(folder) / (rel[: -len(".onnx")] + suffix))
    return out


def link_parts(desc: dict, src, dst) -> None:
    """Make ``dst/part{i}`` symbolic links to ``src/part{i}`` for every part, so a config in
    ``dst`` can name graphs (and their binaries / weight files, found beside them) in ``src``
    with relative paths."""
    for p in desc["parts"]:
        (Path(dst) / f"part{p['index']}").symlink_to(
            Path(src).resolve() / f"part{p['index']}", target_is_directory=True
        )


def write_genai_config(desc: dict, out_path, model_files: dict, **kw) -> dict:
    """Write :func:`genai_config` to ``out_path``; returns the dict."""
    cfg = genai_config(desc, model_files, **kw)
    Path(out_path).write_text(json.dumps(cfg, indent=1))
    return cfg


def declared_tensors(config: dict, source: str = "genai_config.json") -> tuple[dict, list]:
    """What a ``genai_config.json`` (``config``, the parsed dict) says of each compiled model
    genai will load: {pipeline entry's ``filename``: :class:`tasks.qnn.context_binary_checks.Declared`}
    with every input and output the entry names, and the shapes genai feeds or expects for
    those it manages: ``input_ids`` [1, S] on prompt entries and [1, 1] on token entries
    (S = ``sliding_window.window_size``), ``logits`` [1, S or 1, ``vocab_size``], each layer's
    KV buffer [1, ``num_key_value_heads``, ``context_length``, ``head_size``] (genai shares one
    buffer for past and present: module docstring). Second: the tensors genai looks for in
    some graph, as one ``Declared``: every layer's KV names from ``past_key_names`` /
    ``past_value_names`` (inputs) and ``present_key_names`` / ``present_value_names`` (outputs),
    ``%d`` = the layer (``num_hidden_layers``)."""
    from tasks.qnn.context_binary_checks import Declared

    m = config["model"]
    dec = m["decoder"]
    S = dec.get("sliding_window", {}).get("window_size")
    kv = (1, dec["num_key_value_heads"], m["context_length"], dec["head_size"])
    layers = range(dec["num_hidden_layers"])
    past = {
        p % i for p in (dec["inputs"].get("past_key_names"), dec["inputs"].get("past_value_names")) if p for i in layers
    }
    present = {
        p % i
        for p in (dec["outputs"].get("present_key_names"), dec["outputs"].get("present_value_names"))
        if p
        for i in layers
    }
    kv_names = past | present
    out = {}
    for entry in dec["pipeline"]:
        ((name, e),) = entry.items()
        rows = S if e.get("run_on_prompt", True) and not e.get("run_on_token_gen", True) else 1
        shapes = {
            dec["inputs"].get("input_ids", "input_ids"): (1, rows) if S else None,
            dec["outputs"].get("logits", "logits"): (1, rows, m["vocab_size"]) if S else None,
            **{n: kv for n in kv_names},
        }
        out[e["filename"]] = Declared(
            {n: shapes.get(n) for n in e.get("inputs", [])},
            {n: shapes.get(n) for n in e.get("outputs", [])},
            f"{source} ({name})",
        )
    kv = Declared({n: kv for n in past}, {n: kv for n in present}, f"{source} (KV cache names)")
    return out, [kv]


def register_qnn() -> str:
    """Register onnxruntime-qnn's plugin EP library with onnxruntime-genai (once per process;
    genai has its own ORT environment, separate from ``onnxruntime``'s). Returns the EP name."""
    global _REGISTERED
    import onnxruntime_genai as og
    import onnxruntime_qnn

    if not _REGISTERED:
        og.register_execution_provider_library(onnxruntime_qnn.EP_NAME, onnxruntime_qnn.get_library_path())
        _REGISTERED = True
    return onnxruntime_qnn.EP_NAME


class GenaiRunner:
    """Greedy generation through ``onnxruntime_genai`` on a folder holding ``genai_config.json``.

    ``qnn=True`` registers the QNN plugin EP first (needed when the config names the qnn
    provider). Loading creates every pipeline session (genai's ``DecoderOnlyPipelineModel``)."""

    def __init__(self, folder, qnn: bool = False):
        import onnxruntime_genai as og

        if qnn:
            register_qnn()
        self.og = og
        self.config = json.loads((Path(folder) / "genai_config.json").read_text())
        self.model = og.Model(str(folder))

    def generate(self, prompt_ids, max_new_tokens: int) -> list[int]:
        """Greedy continuation of ``prompt_ids`` (>= 2 tokens, none equal to pad_token_id; one
        token would skip the prompt graphs): at most ``max_new_tokens`` new ids; genai stops at
        eos and leaves it out (so fewer ids mean the next one was eos).
        Raises ValueError for a prompt genai's windowed inputs would misread."""
        m = self.config["model"]
        ids = [int(t) for t in prompt_ids]
        if len(ids) < 2 or m["pad_token_id"] in ids:
            raise InputError(
                f"genai's windowed pipeline needs >= 2 prompt tokens and none equal to "
                f"pad_token_id={m['pad_token_id']}: {ids}"
            )
        S = m["decoder"]["sliding_window"]["window_size"]
        padded = -(-len(ids) // S) * S  # genai's sequence holds the padded prompt (generators.cpp)
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=padded + max_new_tokens, batch_size=1)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(ids)
        while not gen.is_done():
            gen.generate_next_token()
        return [int(t) for t in gen.get_sequence(0)[padded:]]


def _generate_child(folder: str, qnn: bool, prompts: list[list[int]], max_new_tokens: int) -> None:
    """Child side of :func:`generate_in_child`: one JSON line per prompt."""
    runner = GenaiRunner(folder, qnn=qnn)
    for ids in prompts:
        print(json.dumps({"tokens": runner.generate(ids, max_new_tokens)}), flush=True)


def generate_in_child(
    folder, prompts: list[list[int]], max_new_tokens: int, *, qnn: bool, timeout: float = 3600
) -> list[list[int]]:
    """:meth:`GenaiRunner.generate` of every prompt (token ids) on ``folder/genai_config.json``
    in a child process (:func:`tasks.proc.child.run_function`): genai creates every part's
    sessions at once, and what it holds goes back to the system when the child ends (in the
    verify stage's process it stayed: the 0.86 B benchmark's verify peaked at 4.98 GiB beside
    LLMRunner's sessions, benchmarks/README.md), and the stage's tree peak counts the child's
    own. Returns the tokens per prompt. Raises RuntimeError with the child's output tail when it
    fails or answers fewer prompts."""
    from tasks.proc.child import run_function

    r = run_function(
        _generate_child,
        str(folder),
        qnn,
        [[int(t) for t in p] for p in prompts],
        max_new_tokens,
        cwd=str(folder),
        timeout=timeout,
    )
    got = [json.loads(ln)["tokens"] for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or len(got) != len(prompts):
        raise RuntimeError(
            f"onnxruntime-genai on {folder}: expected {len(prompts)} answers, found {len(got)} "
            f"(exit {r.returncode}): {r.tail(1500)}"
        )
    return got
