"""Sequential GPTQ over an ONNX graph, one MatMul input at a time: the reference method of
Frantar et al. 2022 (github.com/IST-DASLab/gptq ``llama.py`` ``llama_sequential`` with
``--true-sequential``): the MatMul weights are grouped by the tensor they read (a decoder layer's
q/k/v projections, its o_proj, its gate/up projections, its down_proj, an LM head), and for each
group in graph order its input's Hessian is gathered with every group before it already quantized
(their dequantized GPTQ weights), its weights quantized, and the graph run on with them. Only one
group's Hessian is in memory at a time.

How the graph is cut (no prefix re-run): every node gets the rank of the last group whose weights
it depends on (``-1``: none; such nodes, e.g. positions, masks, the token embedding, are
recomputed by each piece that needs them). After group g, the *carried* tensors are those that
depend on groups <= g and are read by a node of a later group on the way to a later group's
MatMul inputs (a decoder after its q/k/v projections: the residual stream and the attention's
output, o_proj's input; after o_proj: the residual and the normed input of gate/up). So a
group's input is already carried when its turn comes (the first group's is computed from the
graph inputs), and each group's piece runs from the carried tensors through its MatMuls to the
next carried tensors, with its weights overridden by their GPTQ values: every node runs once over
the feeds, about one pass per graph whatever the depth (the reference runs each layer
once per group and once more). Several graphs of the same weights (an LLM part's prefill and
decode graphs) are cut alike and their inputs summed into the same Hessians.
"""

from __future__ import annotations

from tasks.qnn.gptq import block_factors, spans
from tasks.proc import lazy

np = lazy.module("numpy")
onnx = lazy.module("onnx")
torch = lazy.module("torch")


class Plan:
    """How one graph is cut for sequential GPTQ. ``model``: the fp32 ModelProto, structure only
    (``load_external_data=False``); ``weights``: the MatMul weight names to quantize.

    Attributes: ``keys`` (group names in run order: the group's first weight name in sorted
    order, so a prefill and a decode graph of the same weights name their groups alike),
    ``acts[key]`` ({MatMul input tensor: [weight names]}: one input per group), ``carry[key]``
    (tensors held after that group, sorted). Raises ValueError naming the weight when one weight
    is read by MatMuls of two different inputs (its Hessian would not be one input's)."""

    def __init__(self, model, weights: set[str]):
        g = model.graph
        self.model = model
        by_act: dict[str, list[tuple[int, str]]] = {}
        read_by: dict[str, str] = {}
        for i, n in enumerate(g.node):
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights:
                w, act = n.input[1], n.input[0]
                if read_by.setdefault(w, act) != act:
                    raise ValueError(
                        f"{w}: expected its MatMuls to read one input, found {read_by[w]} and {act} (node {n.name})"
                    )
                by_act.setdefault(act, []).append((i, w))
        key_of, first = {}, {}
        for uses in by_act.values():
            k = min(w for _, w in uses)
            first[k] = min(i for i, _ in uses)
            for _, w in uses:
                key_of[w] = k
        self.keys = sorted(first, key=first.get)
        rank = {k: r for r, k in enumerate(self.keys)}
        self.acts = {k: {} for k in self.keys}
        for act, uses in by_act.items():
            self.acts[key_of[uses[0][1]]][act] = sorted({w for _, w in uses}, key=[w for _, w in uses].index)
        dep, node_dep = {}, []
        for n in g.node:
            d = max((dep.get(t, -1) for t in n.input if t), default=-1)
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in key_of:
                r = rank[key_of[n.input[1]]]
                if d > r:
                    raise ValueError(
                        f"{n.input[1]}: expected its MatMul ({n.name}) to read only tensors of the "
                        f"groups before its own ({self.keys[r]}), found one of {self.keys[d]} "
                        f"(the graph's nodes are not in topological order)"
                    )
                d = r
            node_dep.append(d)
            for o in n.output:
                dep[o] = d
        self.dep = dep
        # the nodes on the way to some group's MatMul inputs; the carried tensors are what they
        # read from an earlier group
        producer = {o: i for i, n in enumerate(g.node) for o in n.output}
        needed, todo = set(), [a for k in self.keys for a in self.acts[k]]
        while todo:
            t = todo.pop()
            i = producer.get(t)
            if i is None or i in needed:
                continue
            needed.add(i)
            todo.extend(x for x in g.node[i].input if x)
        reads = [(t, node_dep[i]) for i in sorted(needed) for t in g.node[i].input if t]
        reads += [(a, rank[k]) for k in self.keys for a in self.acts[k]]  # the MatMuls themselves
        carry: dict[str, set] = {k: set() for k in self.keys}
        for t, r in reads:
            for c in range(dep.get(t, -1), r) if dep.get(t, -1) >= 0 else ():
                carry[self.keys[c]].add(t)
        self.carry = {k: sorted(v) for k, v in carry.items()}
        self._producer = producer

    def subgraph(self, outputs: list[str], given: set[str], types: dict):
        """A ModelProto computing ``outputs`` from the tensors ``given`` (carried tensors, typed
        by ``types``: {name: numpy dtype}) and the graph's own inputs and initializers: the nodes
        on the way, in graph order; external initializers stay references to the fp32 graph's
        file. Returns (model bytes, [graph input names it reads], [initializer names])."""
        g = self.model.graph
        inits = {i.name: i for i in g.initializer}
        keep, todo, seen = set(), list(outputs), set()
        while todo:
            t = todo.pop()
            if t in seen or t in given or t in inits:
                continue
            seen.add(t)
            i = self._producer.get(t)
            if i is not None and i not in keep:
                keep.add(i)
                todo.extend(x for x in g.node[i].input if x)
        nodes = [g.node[i] for i in sorted(keep)]
        used = {x for n in nodes for x in n.input}
        ins = [i for i in g.input if i.name in used and i.name not in given]
        ins += [
            onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(types[t]), None)
            for t in sorted(given)
            if t in used or t in outputs
        ]
        graph = onnx.helper.make_graph(
            nodes,
            "gptq_piece",
            ins,
            [onnx.ValueInfoProto(name=o) for o in outputs],
            initializer=[inits[t] for t in sorted(used) if t in inits],
        )
        m = onnx.helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)
        return m.SerializeToString(), [i.name for i in ins], [t for t in sorted(used) if t in inits]


def _session(model_bytes: bytes, folder, overrides: dict | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    keep = []
    for name, a in (overrides or {}).items():
        v = ort.OrtValue.ortvalue_from_numpy(a)
        keep.append(v)
        so.add_initializer(name, v)
    s = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    s._npubuild_keep = keep  # the overriding arrays must outlive the session
    return s


def _inputs(names: list[str], feed: dict, state: dict) -> dict:
    """A piece's inputs: carried tensors from ``state``, the rest from the feed."""
    return {k: state[k] if k in state else feed[k] for k in names}


def _feed(feeds, i: int, names: list[str]) -> dict:
    load = getattr(feeds, "load", None)  # a FeedStore reads only the arrays asked for
    return load(i, names) if load else {k: feeds[i][k] for k in names if k in feeds[i]}


def sequential(
    graphs, weights: set[str], quantize, damp: float, dtype: str = "float32", log=None, span: int | None = None
) -> dict:
    """Run sequential GPTQ. ``graphs``: [(fp32 graph path, feeds)] of graphs holding the same
    ``weights`` (feeds: a sequence of feed dicts or a :class:`tasks.llm.feed_store.FeedStore`);
    ``quantize(names, U, dead, last) -> {name: W_hat}``: encodes the weights ``names`` that read
    one input with the inverse-Hessian factor of that input (:func:`tasks.qnn.gptq.inverse_factor`;
    with ``span`` and an input wider than it, ``[(k0, U_b)]``: the factors of the Hessian's
    diagonal blocks of :func:`tasks.qnn.gptq.spans`, only those blocks summed: ``quantize.gptq_span``)
    and returns their dequantized values, float32 [K, N], which the later groups' inputs are
    computed with ({} when ``last``: the last group, nothing runs after it). Hessians are X^T X / rows in
    ``dtype`` (rows of padding tokens left out where a feed has ``attention_mask`` with one
    entry per row). ``log``: called with one line per group (its weights, rows, and the wall
    seconds of its three steps: the inputs' pass (none but for the first group: the later
    groups' inputs are carried), the rounding, the outputs' pass). Returns
    {"groups": n, "rows": {group: rows}, "hessian_bytes": the largest group's Hessians in
    bytes, "batched": the groups' outputs pieces that ran row-wise, over the graphs (:func:`_carry`),
    "seconds": {"inputs", "rounding", "outputs"}: wall seconds summed over the groups}."""
    import time
    from pathlib import Path

    plans, states = [], []
    for path, feeds in graphs:
        m = onnx.load(str(path), load_external_data=False)
        plans.append((Plan(m, weights), Path(path).resolve().parent, feeds))
        states.append([{} for _ in range(len(feeds))])
    keys = plans[0][0].keys
    t = getattr(torch, dtype)
    report = {
        "groups": len(keys),
        "rows": {},
        "hessian_bytes": 0,
        "batched": 0,
        "seconds": {"inputs": 0.0, "rounding": 0.0, "outputs": 0.0},
    }
    for gi, key in enumerate(keys):
        t0 = time.perf_counter()
        H: dict[tuple, object] = {}  # {weights reading one input: X^T X}
        rows: dict[tuple, int] = {}
        for (plan, folder, feeds), state in zip(plans, states):
            acts = list(plan.acts.get(key, {}))
            if not acts:
                continue
            given = set(state[0]) if state else set()
            types = {k: v.dtype for k, v in state[0].items()} if state else {}
            inputs = {i.name for i in plan.model.graph.input}
            direct = [a for a in acts if a in inputs or a in given]  # read as they are, no piece
            run = [a for a in acts if a not in direct]
            mb, ins, _ = plan.subgraph(run, given, types) if run else (b"", [], [])
            sess = _session(mb, folder) if run else None
            for i in range(len(feeds)):
                f = _feed(feeds, i, sorted({*ins, *direct, "attention_mask"}))
                mask = f.get("attention_mask")
                outs = sess.run(run, _inputs(ins, f, state[i])) if run else []
                outs += [state[i][a] if a in state[i] else f[a] for a in direct]
                for a, x in zip(run + direct, outs):
                    x = x.reshape(-1, x.shape[-1])
                    if mask is not None and x.shape[0] == np.size(mask):
                        x = x[np.asarray(mask).reshape(-1).astype(bool)]
                    x = torch.as_tensor(x).to(t)
                    a = tuple(sorted(plan.acts[key][a]))  # the weights reading it: the same in every graph
                    if a not in H:
                        H[a] = [(k0, torch.zeros((k1 - k0, k1 - k0), dtype=t)) for k0, k1 in spans(x.shape[1], span)]
                        rows[a] = 0
                    for k0, h in H[a]:
                        xb = x[:, k0 : k0 + h.shape[0]]
                        h.addmm_(xb.T, xb)
                    rows[a] += x.shape[0]
            del sess
        report["hessian_bytes"] = max(
            report["hessian_bytes"], sum(h.numel() * h.element_size() for hs in H.values() for _, h in hs)
        )
        report["rows"][key] = max(rows.values(), default=0)
        t1 = time.perf_counter()
        W_hat = {}
        for a in list(H):
            U, dead = block_factors(H.pop(a), damp, dtype, rows[a])
            W_hat.update(quantize(list(a), U, dead, gi == len(keys) - 1))
            del U
        t2 = time.perf_counter()
        batched = _carry(plans, states, key, W_hat) if gi < len(keys) - 1 else 0
        report["batched"] += batched
        t3 = time.perf_counter()
        for k, a, b in (("inputs", t0, t1), ("rounding", t1, t2), ("outputs", t2, t3)):
            report["seconds"][k] += b - a
        if log:
            log(
                f"GPTQ {key}: {sum(len(a) for a in rows)} weights, {report['rows'][key]} rows; inputs {t1 - t0:.1f} s, "
                f"rounding {t2 - t1:.1f} s, outputs {t3 - t2:.1f} s ({batched} of {len(plans)} graphs row-wise)"
            )
    return report


def _carry(plans, states, key: str, W_hat: dict) -> int:
    """Run each graph's piece from the tensors carried before group ``key`` to those carried
    after it, with the group's weights overridden by their dequantized GPTQ values ``W_hat``,
    for every feed; ``states`` (per graph, per feed: {tensor: array}) is updated in place. A
    piece whose nodes keep rows apart (:func:`rowwise`) and reads only carried tensors runs
    over the rows of many feeds at once (:data:`ROWS_PER_CALL`): the same values up to float
    rounding (onnxruntime's kernels may round a row's last bit differently with the rows in the
    call; the same feeds always make the same calls), and a decode feed's one row no longer a
    pass over the group's weights of its own. Returns how many graphs' pieces ran so."""
    batched = 0
    for (plan, folder, feeds), state in zip(plans, states):
        carry = plan.carry.get(key, [])
        new = [c for c in carry if not state or c not in state[0]]
        got = [{} for _ in range(len(feeds))]
        if new:
            given = set(state[0]) if state else set()
            types = {k: v.dtype for k, v in state[0].items()} if state else {}
            mb, ins, inits = plan.subgraph(new, given, types)
            sess = _session(mb, folder, {w: W_hat[w] for w in inits if w in W_hat})
            if all(i in given for i in ins) and rowwise(onnx.load_from_string(mb).graph, ins, state):
                _run_rows(sess, ins, new, state, got)
                batched += 1
            else:
                for i in range(len(feeds)):
                    f = _feed(feeds, i, ins)
                    got[i] = dict(zip(new, sess.run(new, _inputs(ins, f, state[i]))))
            sess = None
        for i in range(len(feeds)):
            state[i] = {c: got[i][c] if c in got[i] else state[i][c] for c in carry}
    return batched


#: rows (tokens) of many feeds run through a row-wise piece in one call (:func:`_run_rows`)
ROWS_PER_CALL = 512

#: ops whose every output row is computed from the same row of their inputs alone, with the
#: features on the last axis (their constant inputs checked by :func:`rowwise`)
ELEMENTWISE = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Sigmoid",
        "Tanh",
        "Erf",
        "Relu",
        "Exp",
        "Log",
        "Abs",
        "Softplus",
        "Cast",
        "Identity",
        "Clip",
        "Max",
        "Min",
    }
)
LAST_AXIS = frozenset(
    {
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceL2",
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "RMSNormalization",
    }
)


def rowwise(graph, inputs: list[str], state: list[dict]) -> bool:
    """True when the piece ``graph`` (from :meth:`Plan.subgraph`) computes every row of its
    outputs from the same row of its ``inputs`` only, so the rows of several feeds can go
    through it at once: every input of every feed in ``state`` is [1, ..., 1, rows, features]
    of one rank r with the same rows within a feed; every node reads at least one tensor
    computed from the inputs (none is computed from constants alone) and is a MatMul by a 2-D
    initializer, an op of :data:`ELEMENTWISE` whose constant inputs have at most r dimensions
    and vary along the last axis only (so no broadcast adds a dimension), or an op of
    :data:`LAST_AXIS` over the last axis (keepdims) with constant parameters of at most one
    dimension. Anything else (attention, a reshape, a gather by position) gives False, and the
    piece runs one feed at a time."""
    ranks = {state[i][n].ndim for i in range(len(state)) for n in inputs}
    if len(ranks) != 1 or min(ranks) < 2:
        return False
    r = ranks.pop()
    for fs in state:
        if any(int(np.prod(fs[n].shape[:-2])) != 1 for n in inputs) or len({fs[n].shape[-2] for n in inputs}) != 1:
            return False
    inits = {i.name: list(i.dims) for i in graph.initializer}
    const = dict(inits)
    last = (-1, r - 1)
    for n in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "Constant":
            t = attrs.get("value")
            if t is None:
                return False
            const[n.output[0]] = list(t.dims)
            continue
        if all(x in const for x in n.input if x):
            return False  # a tensor of constants alone: its shape is not known here
        if n.op_type == "MatMul":
            if len(inits.get(n.input[1], [])) != 2 or n.input[0] in const:
                return False
        elif n.op_type in ELEMENTWISE:
            if any(len(const[x]) > r or int(np.prod(const[x][:-1])) != 1 for x in n.input if x in const):
                return False
        elif n.op_type in LAST_AXIS:
            if n.input[0] in const:
                return False
            if n.op_type.startswith("Reduce"):
                axes = attrs.get("axes")
                if axes is None and len(n.input) > 1 and n.input[1]:
                    t = next((i for i in graph.initializer if i.name == n.input[1]), None)
                    axes = None if t is None else onnx.numpy_helper.to_array(t).reshape(-1).tolist()
                if axes is None or len(axes) != 1 or axes[0] not in last or attrs.get("keepdims", 1) != 1:
                    return False
            elif attrs.get("axis", -1) not in last or any(x in const and len(const[x]) > 1 for x in n.input[1:]):
                return False
        else:
            return False
    return True


def _run_rows(sess, ins: list[str], outs: list[str], state: list[dict], got: list[dict]) -> None:
    """Run the row-wise piece ``sess`` over every feed's rows, :data:`ROWS_PER_CALL` at a time
    (whole feeds: one larger than that goes alone), the inputs joined along the rows axis
    (-2); each output is cut back into the feeds' rows in ``got`` (per feed: {name: array})."""
    i, n = 0, len(state)
    while i < n:
        j, rows = i, 0
        while j < n and (j == i or rows + state[j][ins[0]].shape[-2] <= ROWS_PER_CALL):
            rows += state[j][ins[0]].shape[-2]
            j += 1
        feed = {k: np.concatenate([state[f][k] for f in range(i, j)], axis=-2) for k in ins}
        res = sess.run(outs, feed)
        for name, y in zip(outs, res):
            if y.shape[-2] != rows:
                raise RuntimeError(f"{name}: expected {rows} rows from a row-wise GPTQ piece, found shape {y.shape}")
        at = 0
        for f in range(i, j):
            m = state[f][ins[0]].shape[-2]
            got[f] = {name: np.ascontiguousarray(y[..., at : at + m, :]) for name, y in zip(outs, res)}
            at += m
        i = j
