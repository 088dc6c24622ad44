"""Calibration feeds for the exported LLM graphs, computed with the fp32 HF model.

The feeds are recorded from :class:`tasks.llm.runner.LLMRunner` running over real text, so they
have exactly the deployment layout (left-padded prefill chunks, additive masks, KV slots):

* prefill feeds: prompts of varied length (shorter than S -> padded; longer than S -> a second
  chunk with a real, non-empty past), and
* decode feeds: teacher-forced steps over the text that follows each prompt, so ``past_key_*`` /
  ``past_value_*`` are REAL caches of the fp32 model (not random), at many fill levels n;
* parts i > 0 get the real ``hidden_states_in`` produced by part i-1.

By default the graphs are run by :func:`hf_session_factory`, i.e. by the HF ``transformers`` model
in torch (fp32) through the same wrapper code that :mod:`tasks.llm.export` exports; passing
``make_session`` (e.g. onnxruntime CPU over the fp32 ONNX) gives the same numbers to ~1e-5.
"""

from __future__ import annotations

import json
import random
from collections import namedtuple
from pathlib import Path

import numpy as np

from .runner import LLMRunner

_Arg = namedtuple("_Arg", "name shape type")


class _TorchPartSession:
    """Minimal InferenceSession look-alike running one exported part in torch (fp32)."""

    def __init__(self, wrapper, gdesc):
        self.wrapper = wrapper
        self.ins = [_Arg(i["name"], i["shape"], i["dtype"]) for i in gdesc["inputs"]]
        self.outs = [_Arg(o["name"], o["shape"], o["dtype"]) for o in gdesc["outputs"]]

    def get_inputs(self):
        return self.ins

    def get_outputs(self):
        return self.outs

    def run(self, names, feeds):
        import torch

        args = [torch.from_numpy(np.ascontiguousarray(feeds[a.name])) for a in self.ins]
        with torch.no_grad():
            res = self.wrapper(*args)
        by_name = {o.name: r.numpy() for o, r in zip(self.outs, res)}
        return [by_name[n] for n in names]


def hf_session_factory(model_dir, export_dir):
    """Return ``make_session(path)`` that runs the graph at ``path`` (a file listed in
    ``export_dir/export.json``) with the fp32 HF model from ``model_dir`` in torch."""
    import torch
    from transformers import AutoModelForCausalLM

    from .export import _torch_modules

    export_dir = Path(export_dir)
    desc = json.loads((export_dir / "export.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    Wrapper = _torch_modules()
    n = len(desc["parts"])
    table = {}
    for p in desc["parts"]:
        for g, S in (("prefill", desc["seq_len"]), ("decode", 1)):
            table[str((export_dir / p[g]["path"]).resolve())] = (p, g, S)

    def make_session(path):
        p, g, S = table[str(Path(path).resolve())]
        lo, hi = p["layers"]
        w = Wrapper(model, lo, hi, p["index"] == 0, p["index"] == n - 1, S, desc["context_len"],
                    desc["lm_head"], desc["embed"]).eval()
        return _TorchPartSession(w, p[g])

    return make_session


def collect_calibration_feeds(model_dir, export_dir, text_path, *, n_prompts: int = 8,
                              decode_steps: int = 24, decode_keep: int = 4, seed: int = 0,
                              make_session=None) -> dict:
    """Record calibration feeds for every part's prefill and decode graph.

    Args:
        model_dir: HF folder (fp32 model + tokenizer).
        export_dir: folder written by :func:`tasks.llm.export.export_llm`.
        text_path: UTF-8 text; paragraphs (blank-line separated) are tokenized and joined with eos.
        n_prompts: number of prompts; prompt lengths cycle over ~S/4, S/2, S, 1.5*S (capped so
            prompt + decode_steps fits the context).
        decode_steps: teacher-forced decode steps after each prompt (real next tokens of the text).
        decode_keep: decode feeds kept per prompt (evenly spaced over the steps).
        seed: picks the prompt start offsets.
        make_session: graph runner factory; default :func:`hf_session_factory` (torch fp32).

    Returns ``{"prefill": [list_of_feed_dicts for part 0, part 1, ...], "decode": [...]}``; each
    feed dict maps input name -> numpy array (int32 / float32, the graph's static shapes).
    Sizes: per decode feed ~ 2 * layers_of_part * Hkv * (C-1) * d * 4 bytes.
    Raises ValueError if the text is too short for a prompt plus ``decode_steps``.
    """
    from transformers import AutoTokenizer

    export_dir = Path(export_dir)
    desc = json.loads((export_dir / "export.json").read_text())
    S, C = desc["seq_len"], desc["context_len"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    paragraphs = [p.strip() for p in Path(text_path).read_text().split("\n\n") if p.strip()]
    ids: list[int] = []
    for p in paragraphs:
        ids += tok(p)["input_ids"] + [eos]
    if make_session is None:
        make_session = hf_session_factory(model_dir, export_dir)
    n_parts = len(desc["parts"])
    rec = {"prefill": [[] for _ in range(n_parts)], "decode": [[] for _ in range(n_parts)]}
    keep = {"on": True}

    def recorder(part, kind, feeds):
        if keep["on"]:
            rec[kind][part].append({k: np.array(v, copy=True) for k, v in feeds.items()})

    runner = LLMRunner.from_export(export_dir, make_session, recorder=recorder, pad_id=eos)
    rng = random.Random(seed)
    lengths = [max(1, S // 4), max(1, S // 2), S, S + max(1, S // 2)]
    max_prompt = min(C - S, C - 1 - decode_steps)  # prefill needs n <= C-S before each chunk
    for k in range(n_prompts):
        L = min(lengths[k % len(lengths)], max_prompt)
        if L < 1 or len(ids) < L + decode_steps + 1:
            raise ValueError("text too short or context too small for calibration")
        start = rng.randrange(0, len(ids) - L - decode_steps)
        runner.reset()
        keep["on"] = True
        runner.feed(ids[start:start + L])
        want = set(np.linspace(0, decode_steps - 1, decode_keep).round().astype(int).tolist())
        for j in range(decode_steps):
            keep["on"] = j in want
            runner.step(ids[start + L + j])
        keep["on"] = True
    return rec


try:
    from onnxruntime.quantization import CalibrationDataReader as _Base
except Exception:  # pragma: no cover
    _Base = object


class FeedsDataReader(_Base):
    """``onnxruntime.quantization.CalibrationDataReader`` over a list of feed dicts.

    ``rewind()`` restarts it (ORT's quantizer reads the data once; QNN helpers may read twice)."""

    def __init__(self, feeds: list[dict]):
        self.feeds = list(feeds)
        self._i = 0

    def get_next(self):
        if self._i >= len(self.feeds):
            return None
        self._i += 1
        return self.feeds[self._i - 1]

    def rewind(self):
        self._i = 0

    def __len__(self):
        return len(self.feeds)
