"""Sequential (layer-by-layer) GPTQ over an ONNX graph: the reference method of Frantar et al.
2022 (github.com/IST-DASLab/gptq ``llama.py`` ``llama_sequential``): the MatMul weights are
grouped by layer, and for each layer in graph order its inputs' Hessians are gathered with the
layers before it already quantized (their dequantized GPTQ weights), its weights quantized,
and the layer run again with them to give the next layer its inputs. Only one layer's Hessians
are in memory at a time.

How the graph is cut (no per-layer prefix re-run): every node gets the index of the last layer
whose weights it depends on (``-1``: none; such nodes, e.g. positions, masks, the token
embedding, are recomputed by each piece that needs them). After layer k, the *carried* tensors
are those that depend on layers <= k and are read by a node of a later layer on the way to a
later layer's MatMul inputs (for a decoder: the residual stream and the next layer's normed
input; for an encoder: the layer's output). Layer k is two subgraphs of the fp32 graph, cut by
tensor name: from the carried tensors and graph inputs to the layer's MatMul inputs (Hessian
run, fp32 weights of layer k), and to the next carried tensors (with layer k's weights
overridden by their dequantized GPTQ values). So each layer's nodes run twice over the feeds
(as the reference code does), and the forward cost is about two passes over the feeds per
graph, whatever the depth. Several graphs of the same weights (an LLM part's prefill and
decode graphs) are cut alike and their inputs summed into the same Hessians.

Layers: the index in a weight's name or its MatMul node's name (``layers.3.``, ``layer.3/``,
``h.3.``, ``blocks.3``); a weight with none (an LM head, a pooler) is a group of the weights
that read the same input. Groups run in the order their first MatMul appears in the graph.
"""

from __future__ import annotations

import re

from .gptq import block_factors, spans
from .proc import lazy

np = lazy.module("numpy")
onnx = lazy.module("onnx")
torch = lazy.module("torch")

_LAYER = re.compile(r"(?:^|[./_])(?:layers?|h|blocks?)[./_](\d+)(?:[./_]|$)")


def layer_key(weight: str, node: str) -> str | None:
    """The layer a MatMul weight belongs to: ``"layer <i>"`` from the weight's name, else from
    its node's name; None when neither holds a layer index."""
    for s in (weight, node):
        m = _LAYER.search(s)
        if m:
            return f"layer {int(m.group(1))}"
    return None


class Plan:
    """How one graph is cut for sequential GPTQ. ``model``: the fp32 ModelProto, structure only
    (``load_external_data=False``); ``weights``: the MatMul weight names to quantize.

    Attributes: ``keys`` (group names in run order), ``acts[key]`` ({MatMul input tensor:
    [weight names]}), ``carry[key]`` (tensors held after that group, sorted). Raises ValueError
    (naming the weight) when a group's MatMul reads a tensor that depends on a later group
    (the names put one layer's weights after another's in the graph)."""

    def __init__(self, model, weights: set[str]):
        g = model.graph
        self.model = model
        by_act: dict[str, list[tuple[int, str, str]]] = {}
        for i, n in enumerate(g.node):
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights:
                by_act.setdefault(n.input[0], []).append((i, n.input[1], n.name))
        key_of, first = {}, {}
        for act, uses in by_act.items():
            for i, w, node in uses:
                k = layer_key(w, node) or f"input of {uses[0][1]}"
                key_of[w] = k
                first[k] = min(first.get(k, i), i)
        self.keys = sorted(first, key=first.get)
        rank = {k: r for r, k in enumerate(self.keys)}
        self.acts = {k: {} for k in self.keys}
        for act, uses in by_act.items():
            for _, w, _ in uses:
                self.acts[key_of[w]].setdefault(act, []).append(w)
        dep, node_dep = {}, []
        for n in g.node:
            d = max((dep.get(t, -1) for t in n.input if t), default=-1)
            if n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in key_of:
                r = rank[key_of[n.input[1]]]
                if d > r:
                    raise ValueError(f"{n.input[1]}: expected its MatMul ({n.name}) to read only tensors of layers "
                                     f"before {self.keys[r]}, found one of {self.keys[d]}")
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
        ins += [onnx.helper.make_tensor_value_info(t, onnx.helper.np_dtype_to_tensor_dtype(types[t]), None)
                 for t in sorted(given) if t in used or t in outputs]
        graph = onnx.helper.make_graph(nodes, "gptq_piece", ins, [onnx.ValueInfoProto(name=o) for o in outputs],
                                       initializer=[inits[t] for t in sorted(used) if t in inits])
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


def sequential(graphs, weights: set[str], quantize, damp: float, dtype: str = "float32",
               log=None, span: int | None = None) -> dict:
    """Run sequential GPTQ. ``graphs``: [(fp32 graph path, feeds)] of graphs holding the same
    ``weights`` (feeds: a sequence of feed dicts or a :class:`tasks.llm.calibration_feeds.FeedStore`);
    ``quantize(names, U, dead, last) -> {name: W_hat}``: encodes the weights ``names`` that read
    one input with the inverse-Hessian factor of that input (:func:`tasks.gptq.inverse_factor`;
    with ``span`` and an input wider than it, ``[(k0, U_b)]``: the factors of the Hessian's
    diagonal blocks of :func:`tasks.gptq.spans`, only those blocks summed: ``quantize.gptq_span``)
    and returns their dequantized values, float32 [K, N], which the later layers' inputs are
    computed with ({} when ``last``: the last group, nothing runs after it). Hessians are X^T X / rows in
    ``dtype`` (rows of padding tokens left out where a feed has ``attention_mask`` with one
    entry per row). ``log``: called with one line per group (its weights, rows, and the wall
    seconds of its three steps: the inputs' pass, the rounding, the outputs' pass). Returns
    {"groups": n, "rows": {group: rows}, "hessian_bytes": the largest group's Hessians in
    bytes, "seconds": {"inputs", "rounding", "outputs"}: wall seconds summed over the groups}."""
    import time
    from pathlib import Path

    plans, states = [], []
    for path, feeds in graphs:
        m = onnx.load(str(path), load_external_data=False)
        plans.append((Plan(m, weights), Path(path).resolve().parent, feeds))
        states.append([{} for _ in range(len(feeds))])
    keys = plans[0][0].keys
    t = getattr(torch, dtype)
    report = {"groups": len(keys), "rows": {}, "hessian_bytes": 0,
              "seconds": {"inputs": 0.0, "rounding": 0.0, "outputs": 0.0}}
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
                        xb = x[:, k0:k0 + h.shape[0]]
                        h.addmm_(xb.T, xb)
                    rows[a] += x.shape[0]
            del sess
        report["hessian_bytes"] = max(report["hessian_bytes"],
                                      sum(h.numel() * h.element_size() for hs in H.values() for _, h in hs))
        report["rows"][key] = max(rows.values(), default=0)
        t1 = time.perf_counter()
        W_hat = {}
        for a in list(H):
            U, dead = block_factors(H.pop(a), damp, dtype, rows[a])
            W_hat.update(quantize(list(a), U, dead, gi == len(keys) - 1))
            del U
        t2 = time.perf_counter()
        if gi < len(keys) - 1:
            _carry(plans, states, key, W_hat)
        t3 = time.perf_counter()
        for k, a, b in (("inputs", t0, t1), ("rounding", t1, t2), ("outputs", t2, t3)):
            report["seconds"][k] += b - a
        if log:
            log(f"GPTQ {key}: {sum(len(a) for a in rows)} weights, {report['rows'][key]} rows; inputs {t1 - t0:.1f} s, "
                f"rounding {t2 - t1:.1f} s, outputs {t3 - t2:.1f} s")
    return report


def _carry(plans, states, key: str, W_hat: dict) -> None:
    """Run each graph's piece from the tensors carried before group ``key`` to those carried
    after it, with the group's weights overridden by their dequantized GPTQ values ``W_hat``,
    for every feed; ``states`` (per graph, per feed: {tensor: array}) is updated in place."""
    for (plan, folder, feeds), state in zip(plans, states):
        carry = plan.carry.get(key, [])
        new = [c for c in carry if not state or c not in state[0]]
        if new:
            given = set(state[0]) if state else set()
            types = {k: v.dtype for k, v in state[0].items()} if state else {}
            mb, ins, inits = plan.subgraph(new, given, types)
            sess = _session(mb, folder, {w: W_hat[w] for w in inits if w in W_hat})
        for i in range(len(feeds)):
            got = {}
            if new:
                f = _feed(feeds, i, ins)
                got = dict(zip(new, sess.run(new, _inputs(ins, f, state[i]))))
            state[i] = {c: got[c] if c in got else state[i][c] for c in carry}
        sess = None
