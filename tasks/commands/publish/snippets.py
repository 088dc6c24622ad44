"""The "Use it" section of a model card (:mod:`.card`, assembled by :mod:`.usage`): the
preprocessing and one runnable snippet per runtime the bundle serves (:func:`snippets`:
onnxruntime's QNN EP for an encoder; onnxruntime-genai and, with ``bundle.runtimes: [genai,
genie]``, Genie for an LLM), built from the shipped files: an encoder's graph inputs
(:func:`_onnx_io`, also the I/O tables' reader) and an LLM's chat template (:func:`chat_parts`).
Every snippet is a fenced block (```python) that runs as written in the bundle folder; the
card test extracts and runs each one against a published bundle (tests/commands/test_cards.py).
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

from tasks.qnn.ep import provider_options

#: the stand-in user message the chat template is rendered with, to cut it into the text
#: before and after a user's message (:func:`chat_parts`)
_MARK = "\u2063USER-MESSAGE\u2063"


def _onnx_io(path: Path, declared: dict | None = None) -> list[dict]:
    """Inputs and outputs of an (EPContext) ONNX model: name, in/out, dtype, shape; scale and
    zero point from ``declared`` ({name: export.json row}) when it declares them."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    rows = []
    for io, vals in (("in", m.graph.input), ("out", m.graph.output)):
        for v in vals:
            t = v.type.tensor_type
            d = (declared or {}).get(v.name, {})
            rows.append(
                {
                    "name": v.name,
                    "io": io,
                    "dtype": onnx.TensorProto.DataType.Name(t.elem_type),
                    "shape": [x.dim_value if x.HasField("dim_value") else x.dim_param for x in t.shape.dim],
                    "scale": d.get("scale"),
                    "zero_point": d.get("zero_point"),
                }
            )
    return rows


def chat_parts(tokenizer_dir: Path) -> tuple[str, str] | None:
    """(text before, text after) a single user message in the model's chat template
    (``tokenizer_config.json`` ``chat_template``, rendered by transformers'
    ``apply_chat_template`` with ``add_generation_prompt``), without a leading BOS the
    tokenizer adds itself; None when the tokenizer has no chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    if not getattr(tok, "chat_template", None):
        return None
    text = tok.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False, add_generation_prompt=True)
    before, after = text.split(_MARK, 1)
    bos = tok.bos_token
    if bos and before.startswith(bos) and tok("x")["input_ids"][:1] == [tok.bos_token_id]:
        before = before[len(bos) :]  # the tokenizer prepends it when encoding
    return before, after


def _py(text: str) -> list[str]:
    return ["```python", *text.strip("\n").splitlines(), "```"]


def _qnn_session(model: str, target: str) -> str:
    """The snippet lines that open ``model`` (an EPContext model) with onnxruntime's QNN EP for
    ``target`` (its provider options, tasks/qnn/ep.py), no CPU fallback: a ``session``."""
    return f"""
ort.register_execution_provider_library(onnxruntime_qnn.EP_NAME, onnxruntime_qnn.get_library_path())
so = ort.SessionOptions()
so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # fail rather than run on the CPU
qnn = [d for d in ort.get_ep_devices() if d.ep_name == onnxruntime_qnn.EP_NAME]
so.add_provider_for_devices(qnn, {json.dumps(provider_options(target))})  # {target}
session = ort.InferenceSession("{model}", sess_options=so)"""


def _encoder_snippet(lay: dict, files: dict[str, Path], recipe) -> list[str]:
    d, f = next(iter(lay["folders"].items()))
    rel = f["models"][0]
    rows = _onnx_io(files[rel])
    target = d or recipe.compile.targets[0]
    L = next(r["shape"][1] for r in rows if r["name"] == "input_ids")
    feeds = "\n".join(
        f'    "{r["name"]}": enc["{r["name"]}"].astype(np.{r["dtype"].lower()}),'
        if r["name"] != "token_type_ids"
        else f'    "{r["name"]}": np.zeros_like(enc["input_ids"], dtype=np.{r["dtype"].lower()}),'
        for r in rows
        if r["io"] == "in"
    )
    out_name = next(r["name"] for r in rows if r["io"] == "out")
    pool = recipe.task == "feature-extraction" and out_name == "last_hidden_state"
    tail = (
        """
mask = feeds["attention_mask"][..., None].astype(np.float32)
embedding = (output * mask).sum(axis=1) / mask.sum(axis=1)  # mean over the real tokens
embedding /= np.linalg.norm(embedding, axis=1, keepdims=True)  # for cosine similarity
print(embedding.shape, embedding[0, :4])"""
        if pool
        else """
print(output.shape, output.reshape(-1)[:4])"""
    )
    tokdir = posixpath.dirname(next(r for r in files if posixpath.basename(r) == "tokenizer_config.json")) or "."
    return _py(
        f'''
import numpy as np
import onnxruntime as ort
import onnxruntime_qnn  # the QNN execution provider (a plugin of onnxruntime)
from transformers import AutoTokenizer
{_qnn_session(rel, target)}

tok = AutoTokenizer.from_pretrained("{tokdir}")
enc = tok(["The cat sat on the mat."], padding="max_length", truncation=True, max_length={L}, return_tensors="np")
feeds = {{
{feeds}
}}
(output,) = session.run(["{out_name}"], feeds)'''
        + tail
    )


def _genai_snippet(d: str, f: dict, chat) -> list[str]:
    desc = f["export"]
    S, C = desc["seq_len"], desc["context_len"]
    prompt = (
        'question = "Write one sentence about a lighthouse."\n'
        f"prompt = {chat[0]!r} + question + {chat[1]!r}  # the chat template, one user message"
        if chat
        else 'prompt = "The old lighthouse"  # plain text: the tokenizer has no chat template'
    )
    return _py(f'''
import onnxruntime_genai as og
import onnxruntime_qnn  # the QNN execution provider, registered with genai

og.register_execution_provider_library(onnxruntime_qnn.EP_NAME, onnxruntime_qnn.get_library_path())
model = og.Model("{d or "."}")  # the folder of genai_config.json
tok = og.Tokenizer(model)
{prompt}
ids = tok.encode(prompt)
padded = -(-len(ids) // {S}) * {S}  # genai feeds the prompt in windows of {S} tokens, the last padded
params = og.GeneratorParams(model)
params.set_search_options(do_sample=False, max_length=min(padded + 16, {C}))  # at most {C} (the context)
generator = og.Generator(model, params)
generator.append_tokens(ids)
while not generator.is_done():
    generator.generate_next_token()
print(tok.decode(generator.get_sequence(0)[padded:]))''')


def _genie_snippet(d: str, chat) -> list[str]:
    prompt = (
        'question = "Write one sentence about a lighthouse."\n'
        f"prompt = {chat[0]!r} + question + {chat[1]!r}  # the chat template, one user message"
        if chat
        else 'prompt = "The old lighthouse"  # plain text: the tokenizer has no chat template'
    )
    chdir = f'os.chdir("{d}")  # ' if d else "# run in this folder: "
    return _py(f"""
import ctypes
import os

import onnxruntime_qnn  # its wheel ships Genie with the QNN libraries

{chdir}genie_config.json names its files relative to the working folder
name = "Genie.dll" if os.name == "nt" else "libGenie.so"
genie = ctypes.CDLL(os.path.join(os.path.dirname(onnxruntime_qnn.__file__), name))
config, dialog = ctypes.c_void_p(), ctypes.c_void_p()
with open("genie_config.json", encoding="utf-8") as f:
    assert genie.GenieDialogConfig_createFromJson(f.read().encode(), ctypes.byref(config)) == 0
assert genie.GenieDialog_create(config, ctypes.byref(dialog)) == 0
genie.GenieDialog_setMaxNumTokens(dialog, ctypes.c_uint32(16))
reply = []
on_text = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p)(
    lambda text, code, user: reply.append(text.decode("utf-8", "replace") if text else ""))
{prompt}
status = genie.GenieDialog_query(dialog, prompt.encode(), 0, on_text, None)  # 0: a complete sentence
genie.GenieDialog_free(dialog)  # free every handle: without it the process crashed at exit
genie.GenieDialogConfig_free(config)
print(status, "".join(reply))""")


def snippets(recipe, files: dict[str, Path], lay: dict, tools: dict[str, str]) -> list[str]:
    """The card's "Use it" section: preprocessing and one runnable snippet per runtime the
    bundle serves (module docstring), with the pip line of the versions ``tools`` records."""

    def _v(tool: str) -> str:
        return tools.get(tool, "?")

    out = ["", "## Use it", ""]
    if lay["kind"] == "models":
        ((d, f),) = list(lay["folders"].items())[:1]
        rows = _onnx_io(files[f["models"][0]])
        L = next(r["shape"][1] for r in rows if r["name"] == "input_ids")
        pool = recipe.task == "feature-extraction"
        out += [
            f"Run in this folder, with `pip install onnxruntime=={_v('onnxruntime')} "
            f"onnxruntime-qnn=={_v('onnxruntime-qnn')} transformers`. Preprocessing: this folder's tokenizer "
            f"(transformers' `AutoTokenizer`), padded at the end to {L} tokens and truncated beyond (what verify "
            f"fed); every input int32."
            + (
                " Pooling: the mean of `last_hidden_state` over the tokens `attention_mask` marks (the "
                "embedding verify's `pooled_cosine` compares), L2-normalized for cosine similarity."
                if pool
                else ""
            ),
            "",
            "### onnxruntime QNN EP",
            "",
            *_encoder_snippet(lay, files, recipe),
        ]
        if len(lay["folders"]) > 1:
            out += [
                "",
                "Other targets: the same, with that target's folder and provider options: "
                + ", ".join(f"`{t}/`" for t in list(lay["folders"])[1:])
                + ".",
            ]
        return out
    d, f = next(iter(lay["folders"].items()))
    tokdir = next((files[r].parent for r in files if posixpath.basename(r) == "tokenizer_config.json"), None)
    chat = chat_parts(tokdir) if tokdir is not None else None
    desc = f["export"]
    out += [
        f"Prompts go in windows of {desc['seq_len']} tokens into a context of {desc['context_len']} (prompt and "
        "reply together). "
        + (
            "Chat template (`tokenizer_config.json` `chat_template`, rendered by transformers for one user "
            f"message): `{chat[0]!r}` + message + `{chat[1]!r}`; the snippets build the prompt so. For several "
            "turns, render the template itself (`og.Tokenizer.apply_chat_template`, or transformers')."
            if chat
            else "The tokenizer has no chat template (`tokenizer_config.json` has no `chat_template`): "
            "prompts are plain text."
        ),
        "",
        "### onnxruntime-genai",
        "",
        f"`pip install onnxruntime-genai=={_v('onnxruntime-genai')} onnxruntime-qnn=={_v('onnxruntime-qnn')}`; "
        f"genai pads the last prompt window with `pad_token_id`, so a prompt must hold two tokens or more and "
        f"not that token.",
        "",
        *_genai_snippet(d, f, chat),
    ]
    if "genie" in f:
        out += [
            "",
            "### Genie",
            "",
            "Genie's C API (`GenieDialog_*`) from Python; in C, the same calls; with the QAIRT SDK's "
            '`genie-t2t-run -c genie_config.json -p "<prompt>"` (not run here: the SDK\'s tools are not '
            f"installed where this was built). `pip install onnxruntime-qnn=={_v('onnxruntime-qnn')}`. "
            "`genie_config.json` carries the device's engine settings (threads, CPU mask, polling); "
            "the prompt is text, tokenized by Genie with `tokenizer.json`.",
            "",
            *_genie_snippet(d, chat),
        ]
    return out


#: how an ``io.json`` graph's output is read in its snippet, by ``io.json``'s ``decode``
#: (PP-OCR: tasks/vision/decode.py does the same for verify)
_DECODE = {
    "ctc": """
meta = json.load(open("metadata.json"))
chars = ["blank", *meta["character"].splitlines(), " "]  # io.json "decoding": CTC over this alphabet
idx = out[0].argmax(-1)
print("text:", "".join(chars[i] for j, i in enumerate(idx) if i != 0 and (j == 0 or i != idx[j - 1])))""",
    "db": """
text = out[0, 0] > 0.3  # io.json "decoding": a text probability map; PP-OCR boxes its regions above 0.3
print("text pixels:", int(text.sum()), "of", text.size, "in rows", np.flatnonzero(text.any(axis=1))[[0, -1]])""",
    "cls": """
print("turned by", ["0", "180"][int(out[0].argmax())], "degrees; scores", out[0])""",
}


def io_snippet(io: dict, target: str, tools: dict[str, str]) -> list[str]:
    """The "Use it" section of a graph shipped with an ``io.json`` (a model built from an ONNX
    file: its inputs and outputs, ``preprocess`` for an image graph, ``stream`` for an audio
    graph, ``decode`` naming how the output is read): the pip line, then one snippet that opens
    ``model_ctx.onnx`` with onnxruntime's QNN EP for ``target``, makes an input here (a line of
    text drawn with Pillow's own font; one second of silence and one of a tone), preprocesses it
    as ``io.json`` says, runs it and reads the output. [] for an ``io.json`` with neither."""
    head = f"""
import json

import numpy as np
import onnxruntime as ort
import onnxruntime_qnn  # the QNN execution provider (a plugin of onnxruntime)
{"from PIL import Image, ImageDraw, ImageFont" if io.get("preprocess") else ""}{_qnn_session("model_ctx.onnx", target)}
io = json.load(open("io.json"))
"""
    if io.get("preprocess") and io.get("decode") in _DECODE:
        body = """
pre = io["preprocess"]
H, W = pre["size"]
# your image: img = Image.open("line.png").convert("RGB"); here a line of text drawn in Pillow's font
img = Image.new("RGB", (12 * 36, 48), "white")
ImageDraw.Draw(img).text((6, 4), "Hello 2026", fill="black", font=ImageFont.load_default(size=36))
if pre["resize"] == "height":  # H high keeping the aspect ratio, at most W wide; padded below
    img = img.resize((min(W, max(1, round(img.width * H / img.height))), H), Image.BILINEAR)
else:  # fitted into H x W keeping the aspect ratio, top-left on a white canvas
    s = min(H / img.height, W / img.width)
    canvas = Image.new("RGB", (W, H), "white")
    canvas.paste(img.resize((max(1, round(img.width * s)), max(1, round(img.height * s))), Image.BILINEAR))
    img = canvas
x = np.asarray(img, dtype=np.float32) / 255.0
x = x[..., ::-1] if pre["colour"] == "BGR" else x
x = (x - np.array(pre["mean"], np.float32)) / np.array(pre["std"], np.float32)
x = np.pad(x.transpose(2, 0, 1)[None], ((0, 0), (0, 0), (0, 0), (0, W - x.shape[1])), constant_values=pre["pad"])
(out,) = session.run(None, {io["inputs"][0]["name"]: np.ascontiguousarray(x, dtype=np.float32)})""" + _DECODE[
            io["decode"]
        ]
        what = "a line of text drawn here, preprocessed as `io.json` says"
    elif io.get("stream"):
        body = """
st = io["stream"]
rate, frame, ctx = st["rate"], st["frame"], st["context"]
# your audio: mono float32 at `rate` Hz in [-1, 1]; here one second of silence, then one of a tone
t = np.arange(rate, dtype=np.float32) / rate
audio = np.concatenate([np.zeros(rate, np.float32), 0.5 * np.sin(2 * np.pi * 220 * t)])
shapes = {i["name"]: i["shape"] for i in io["inputs"]}
state = {i: np.zeros(shapes[i], np.float32) for i in st["recurrent"]}  # zeros, then each call's output
prob = next(o["name"] for o in io["outputs"] if o["name"] not in st["recurrent"].values())
names = [o.name for o in session.get_outputs()]
before, probs = np.zeros(ctx, np.float32), []
for k in range(0, len(audio) - frame + 1, frame):
    x = np.concatenate([before, audio[k : k + frame]])[None]
    before = x[0, -ctx:]
    got = dict(zip(names, session.run(None, {st["input"]: x, **state})))
    state = {i: got[o] for i, o in st["recurrent"].items()}
    probs.append(float(got[prob].reshape(-1)[0]))
half = len(probs) // 2
print(len(probs), "calls; speech probability max, silence:", round(max(probs[:half]), 3),
      "tone:", round(max(probs[half:]), 3))"""
        what = "two seconds of audio made here, streamed as `io.json` says"
    else:
        return []
    return [
        "",
        "## Use it",
        "",
        f"Run in this folder, with `pip install onnxruntime=={tools.get('onnxruntime', '?')} "
        f"onnxruntime-qnn=={tools.get('onnxruntime-qnn', '?')} numpy"
        + (" pillow`" if io.get("preprocess") else "`")
        + f': {what} (the inputs, preprocessing and decoding are in "How to run it" below).',
        "",
        "### onnxruntime QNN EP",
        "",
        *_py(head + body),
    ]
