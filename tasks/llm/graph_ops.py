"""The ONNX graph writer and the decoder-layer ops both LLM graph layouts are written with
(:mod:`tasks.llm.pipeline_graphs`, onnxruntime-genai's; :mod:`tasks.llm.genie.graphs`, Genie's):
:class:`_Graph` (nodes, initializers and the checkpoint weights a graph uses; the model at opset
:data:`OPSET`), RMSNorm, the MLP's gate activation, linear projections, a layer's q/k/v heads
(:func:`layer_heads`) and the rest of the layer after attention (:func:`layer_tail`), rotary
embedding (full or partial).
"""

from __future__ import annotations

import math

from tasks.proc import lazy

np = lazy.module("numpy")


OPSET = 21
IR_VERSION = 10


def _split_names(g: _Graph, name: str) -> list[str]:
    """The initializer name(s) :func:`_add_split` gave ``name``."""
    if name in g.weights:
        return [name]
    out, j = [], 0
    while f"{name}.{j}" in g.weights:
        out.append(f"{name}.{j}")
        j += 1
    return out


class _Graph:
    """Minimal ONNX graph writer: nodes get names ``/<scope>/<Op>_<k>`` and outputs ``<name>_out``."""

    def __init__(self, weights: dict):
        self.weights = weights
        self.nodes, self.inits, self.used = [], {}, []
        self.count: dict[str, int] = {}

    def w(self, name: str) -> str:
        if name not in self.used:
            self.used.append(name)
        return name

    def const(self, name: str, value, dtype="int64") -> str:
        import onnx

        if name not in self.inits:
            self.inits[name] = onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        return name

    def op(self, scope: str, op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        import onnx

        k = self.count.get(f"{scope}/{op}", 0)
        self.count[f"{scope}/{op}"] = k + 1
        name = f"/{scope}/{op}" + (f"_{k}" if k else "")
        out = out or name + "_out"
        self.nodes.append(onnx.helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def model(self, inputs, outputs):
        import onnx

        def vi(n, shape, dt):
            return onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)

        inits = [self.weights[n] for n in self.used] + list(self.inits.values())
        g = onnx.helper.make_graph(
            self.nodes, "part", [vi(*i) for i in inputs], [vi(*o) for o in outputs], initializer=inits
        )
        return onnx.helper.make_model(
            g, opset_imports=[onnx.helper.make_opsetid("", OPSET)], ir_version=IR_VERSION, producer_name="npubuild"
        )


def _rmsnorm(g: _Graph, scope: str, x: str, weight: str, eps: float) -> str:
    sq = g.op(scope, "Pow", [x, g.const("two", 2.0, np.float32)])
    mean = g.op(scope, "ReduceMean", [sq, g.const("axis_last", [-1])], keepdims=1)
    rstd = g.op(
        scope,
        "Div",
        [
            g.const("one", 1.0, np.float32),
            g.op(scope, "Sqrt", [g.op(scope, "Add", [mean, g.const("eps", eps, np.float32)])]),
        ],
    )
    return g.op(scope, "Mul", [g.op(scope, "Mul", [x, rstd]), g.w(weight)])


def _activation(g: _Graph, scope: str, x: str, act: str) -> str:
    """The MLP's gate activation: ``silu`` as x * Sigmoid(x); ``gelu_pytorch_tanh``
    (``torch.nn.functional.gelu(approximate="tanh")`` = 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x +
    0.044715 x^3)) as x * Sigmoid(2 z), the same function (0.5 (1 + tanh(z)) = sigmoid(2 z)) in the
    ops SiLU already uses on HTP. Measured on the tiny Gemma fixture (w8a16, HTP simulator): the
    same graph with ``Tanh`` gave logits cosine 0.809 against fp32 (0.99994 with the QDQ graph on
    the CPU: HTP's 16-bit Tanh, not the quantization); with ``Sigmoid`` 0.99993."""
    if act == "silu":
        return g.op(scope, "Mul", [x, g.op(scope, "Sigmoid", [x])])
    cube = g.op(scope, "Mul", [x, g.op(scope, "Mul", [x, x])])
    inner = g.op(scope, "Add", [x, g.op(scope, "Mul", [cube, g.const("gelu_c", 0.044715, np.float32)])])
    z2 = g.op(scope, "Mul", [inner, g.const("gelu_k2", 2 * math.sqrt(2 / math.pi), np.float32)])
    return g.op(scope, "Mul", [x, g.op(scope, "Sigmoid", [z2])])


def _linear(g: _Graph, scope: str, x: str, prefix: str, bias: bool) -> str:
    y = g.op(scope, "MatMul", [x, g.w(prefix + ".weight.T")])
    return g.op(scope, "Add", [y, g.w(prefix + ".bias")]) if bias else y


def layer_heads(
    g: _Graph, s: str, p: str, x: str, dims: dict, eps: float, S: int, has_bias: bool, weights: dict
) -> dict[str, str]:
    """The start of decoder layer ``p`` (ONNX scope ``s``), for both graph layouts (this module's
    and Genie's, :mod:`tasks.llm.genie.graphs`): the input RMSNorm of the hidden state ``x`` [1, S, D],
    then the q, k and v projections (with biases when ``has_bias``: Qwen2), each reshaped to
    heads [1, S, n, d] (n = ``num_heads`` for q, ``num_kv_heads`` for k and v) and, where the
    checkpoint has ``<p>.self_attn.{q,k}_norm.weight`` in ``weights`` (Qwen3), RMS-normalized
    per head over d. Returns {"q", "k", "v": tensor names}."""
    H, Hkv, d = dims["num_heads"], dims["num_kv_heads"], dims["head_dim"]
    h = _rmsnorm(g, f"{s}/input_layernorm", x, f"{p}.input_layernorm.weight", eps)
    heads = {}
    for nm, nh in (("q", H), ("k", Hkv), ("v", Hkv)):
        t = _linear(g, f"{s}/self_attn/{nm}_proj", h, f"{p}.self_attn.{nm}_proj", has_bias)
        t = g.op(f"{s}/self_attn/{nm}", "Reshape", [t, g.const(f"shape_{S}_{nh}_{d}", [1, S, nh, d])])
        if f"{p}.self_attn.{nm}_norm.weight" in weights:  # Qwen3: RMSNorm over head_dim, per head
            t = _rmsnorm(g, f"{s}/self_attn/{nm}_norm", t, f"{p}.self_attn.{nm}_norm.weight", eps)
        heads[nm] = t
    return heads


def layer_tail(
    g: _Graph, s: str, p: str, x: str, o: str, dims: dict, eps: float, S: int, out: str | None = None
) -> str:
    """The rest of decoder layer ``p`` (ONNX scope ``s``) after attention, for both graph layouts
    (this module's and Genie's, :mod:`tasks.llm.genie.graphs`): the heads' outputs ``o``, rows of the
    query heads in their order (H x S x d elements), back to [1, S, H*d], ``o_proj`` added to the
    residual ``x`` [1, S, D], then the post-attention RMSNorm, the gated MLP (``dims["act"]``)
    and its residual add. ``out``: the name of the layer's output (a part's hidden state), or a
    generated one. Returns the output's name."""
    H, d = dims["num_heads"], dims["head_dim"]
    o = g.op(f"{s}/self_attn", "Reshape", [o, g.const(f"shape_h_{S}", [1, H, S, d])])
    o = g.op(f"{s}/self_attn", "Transpose", [o], perm=[0, 2, 1, 3])
    o = g.op(f"{s}/self_attn", "Reshape", [o, g.const(f"shape_o_{S}", [1, S, H * d])])
    x = g.op(s, "Add", [x, _linear(g, f"{s}/self_attn/o_proj", o, f"{p}.self_attn.o_proj", False)])
    h = _rmsnorm(g, f"{s}/post_attention_layernorm", x, f"{p}.post_attention_layernorm.weight", eps)
    gate = _linear(g, f"{s}/mlp/gate_proj", h, f"{p}.mlp.gate_proj", False)
    act = _activation(g, f"{s}/mlp/act", gate, dims["act"])
    up = _linear(g, f"{s}/mlp/up_proj", h, f"{p}.mlp.up_proj", False)
    down = _linear(g, f"{s}/mlp/down_proj", g.op(f"{s}/mlp", "Mul", [act, up]), f"{p}.mlp.down_proj", False)
    return g.op(s, "Add", [x, down], out=out)


def _rotate(g: _Graph, scope: str, t: str, cos: str, sin: str, half: int, out: str | None = None) -> str:
    hi = g.op(scope, "Slice", [t, g.const(f"s_{half}", [half]), g.const("s_max", [2**62]), g.const("axis_last", [-1])])
    lo = g.op(scope, "Slice", [t, g.const("s_0", [0]), g.const(f"s_{half}", [half]), g.const("axis_last", [-1])])
    rot = g.op(scope, "Concat", [g.op(scope, "Neg", [hi]), lo], axis=-1)
    return g.op(scope, "Add", [g.op(scope, "Mul", [t, cos]), g.op(scope, "Mul", [rot, sin])], out=out)


def _rotary(g: _Graph, scope: str, t: str, cos: str, sin: str, d: int, rd: int) -> str:
    """Rotary embedding of the first ``rd`` of ``d`` dims of each head (cos/sin tables are
    [.., rd]); the other ``d - rd`` pass through (partial rotary, e.g. Phi-4-mini)."""
    if rd == d:
        return _rotate(g, scope, t, cos, sin, rd // 2)
    rot = g.op(scope, "Slice", [t, g.const("s_0", [0]), g.const(f"s_{rd}", [rd]), g.const("axis_last", [-1])])
    rest = g.op(scope, "Slice", [t, g.const(f"s_{rd}", [rd]), g.const("s_max", [2**62]), g.const("axis_last", [-1])])
    return g.op(scope, "Concat", [_rotate(g, scope, rot, cos, sin, rd // 2), rest], axis=-1)
