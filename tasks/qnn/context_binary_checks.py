"""Check context binaries read back (:func:`tasks.qnn.context_binary.read`) against what the build
expects.

:func:`check` compares a binary with the graphs the build planned (the EPContext models that
reference it, whose I/O is the QDQ graph's), a runtime config's tensors, and the target's SoC
model; every difference is one :class:`Mismatch` line naming binary, graph, tensor, expected and
found. :func:`check_models` reads and checks every binary a set of compiled models references.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tasks.errors import UserError
from tasks.qnn.context_binary import ContextBinary, Tensor, read


class Mismatch(UserError, RuntimeError):
    """A context binary differs from what the build expects: one line per difference, each
    naming the binary, the graph, the tensor, what was expected and what was found (an entry
    edited or damaged since it was built, or a bundle that declares what its binaries lack)."""

    def __init__(self, lines: list[str]):
        self.lines = list(lines)
        super().__init__(
            self.lines[0] + (f" (and {len(self.lines) - 1} more: see the log)" if len(self.lines) > 1 else "")
        )


@dataclass(frozen=True)
class Expected:
    """A graph a binary must hold: its name and, where known, its I/O (name -> (dtype, shape))."""

    name: str
    inputs: dict[str, tuple[str, tuple[int, ...]]]
    outputs: dict[str, tuple[str, tuple[int, ...]]]
    source: str  # where the expectation comes from, for the message


def _onnx_io(values) -> dict[str, tuple[str, tuple[int, ...]]]:
    import onnx

    out = {}
    for v in values:
        t = v.type.tensor_type
        out[v.name] = (
            onnx.TensorProto.DataType.Name(t.elem_type),
            tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim),
        )
    return out


def planned_graphs(root: Path, models: list[str]) -> dict[str, list[Expected]]:
    """{binary path relative to ``root``: the graphs it must hold} from EPContext models
    (``*_ctx.onnx``, paths relative to ``root``): each EPContext node names its graph (the
    node's name is the graph's name in the binary) and its binary (``ep_cache_context``,
    relative to the model); its inputs and outputs, typed from the model, are the I/O the QDQ
    graph had before compile. A weight-shared binary gets the graphs of every model that
    references it; ``Expected.source`` is the model's path. Raises OSError / onnx's
    DecodeError for an unreadable model."""
    import onnx

    out: dict[str, list[Expected]] = {}
    for rel in sorted(models):
        m = onnx.load(str(Path(root) / rel), load_external_data=False)
        typed = {**_onnx_io(m.graph.value_info), **_onnx_io(m.graph.input), **_onnx_io(m.graph.output)}
        nodes = []
        for n in m.graph.node:
            if n.op_type != "EPContext":
                continue
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            ref = attrs.get("ep_cache_context", b"")
            ref = ref.decode() if isinstance(ref, bytes) else str(ref)
            nodes.append((n, int(attrs.get("embed_mode", 0)), ref))
        # a graph QNN split into several partitions (nodes left on the CPU between them) has one
        # main EPContext node naming the binary and others (main_context=0) whose graphs are in it
        mains = {ref for _, embed, ref in nodes if embed == 0 and ref}
        for n, embed, ref in nodes:
            if embed != 0:
                continue  # an embedded binary has no file of its own
            ref = ref or (next(iter(mains)) if len(mains) == 1 else "")
            if not ref:
                continue
            binary = os.path.normpath(os.path.join(os.path.dirname(rel), ref)).replace(os.sep, "/")
            out.setdefault(binary, []).append(
                Expected(
                    n.name,
                    {i: typed[i] for i in n.input if i in typed},
                    {o: typed[o] for o in n.output if o in typed},
                    rel,
                )
            )
    return out


def _io_lines(where: str, expected: dict, found: tuple[Tensor, ...], what: str) -> list[str]:
    have = {t.name: t for t in found}
    lines = []
    for name, (dtype, shape) in expected.items():
        t = have.get(name)
        if t is None:
            lines.append(
                f"{where}, {what} {name}: expected {dtype} {list(shape)}, found no such tensor "
                f"(the graph's {what}s: {', '.join(sorted(have)) or 'none'})"
            )
        elif t.dtype != dtype or tuple(t.shape) != tuple(shape):
            lines.append(f"{where}, {what} {name}: expected {dtype} {list(shape)}, found {t.dtype} {list(t.shape)}")
    return lines


def check(
    binary: ContextBinary,
    expected: list[Expected],
    target: str | None = None,
    exact_graphs: bool = True,
    label: str | None = None,
) -> list[str]:
    """Differences between ``binary`` and the graphs it must hold: each graph of ``expected``
    present (by name) with every input and output of the same name, dtype and shape;
    with ``exact_graphs``, no graph beside them; and the SoC model of ``target`` (a name in
    ``tasks/qnn/targets.py``). ``label``: how lines name the binary (default its file name).
    Returns one line per difference (empty: the binary is as planned)."""
    from tasks.qnn.targets import get as get_target

    name = label or Path(binary.path).name
    lines = []
    soc_model = get_target(target).soc_model if target is not None else None
    if soc_model is not None and binary.soc_model != soc_model:
        lines.append(
            f"{name}: SoC model expected {soc_model} ({target}), found {binary.soc_model} "
            f"(the binary was prepared for another SoC)"
        )
    for e in expected:
        g = binary.graph(e.name)
        if g is None:
            lines.append(
                f"{name}, graph {e.name} (from {e.source}): expected in the binary, found graphs "
                f"{', '.join(x.name for x in binary.graphs) or 'none'}"
            )
            continue
        where = f"{name}, graph {e.name}"
        lines += _io_lines(where, e.inputs, g.inputs, "input") + _io_lines(where, e.outputs, g.outputs, "output")
    if exact_graphs:
        extra = sorted({g.name for g in binary.graphs} - {e.name for e in expected})
        for x in extra:
            lines.append(
                f"{name}, graph {x}: expected no such graph (planned: "
                f"{', '.join(e.name for e in expected)}), found it in the binary"
            )
    return lines


@dataclass(frozen=True)
class Declared:
    """What a runtime config declares of one compiled model's graph (e.g. ``genai_config.json``
    for a pipeline entry): tensor name -> shape (None: the config gives no shape) per direction,
    which file says so, and ``dtypes``: tensor name -> element type as a binary reads back
    (``FLOAT``, ``UINT8``: :data:`tasks.qnn.context_binary.QNN_DTYPES`) for the tensors whose type
    the file gives (``export.json`` does; genai's config does not)."""

    inputs: dict[str, tuple[int, ...] | None]
    outputs: dict[str, tuple[int, ...] | None]
    source: str
    dtypes: dict[str, str] = field(default_factory=dict)


def onnx_dtype_name(numpy_name: str) -> str:
    """The ONNX element type name a binary's tensor reads back as (``FLOAT``, ``UINT8``) of a
    numpy dtype name as ``export.json`` writes it (``float32``, ``uint8``). Raises TypeError
    for a name numpy does not know."""
    import numpy as np
    import onnx

    return onnx.TensorProto.DataType.Name(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(numpy_name)))


def _declared_lines(
    where: str,
    said: dict,
    have: dict[str, Tensor],
    what: str,
    source: str,
    missing: str,
    dtypes: dict[str, str] | None = None,
) -> list[str]:
    """Lines for the tensors ``said`` ({name: shape or None}) that ``have`` ({name: Tensor})
    lacks (``found {missing}``) or holds with another shape, or with another element type than
    ``dtypes`` gives ({name: ONNX type name}); ``where`` prefixes each line."""
    lines = []
    for name, shape in sorted(said.items()):
        t = have.get(name)
        if t is None:
            lines.append(f"{where}{what} {name}: expected (named by {source}), found {missing}")
            continue
        if shape is not None and tuple(t.shape) != tuple(shape):
            lines.append(f"{where}{what} {name}: expected shape {list(shape)} ({source}), found {list(t.shape)}")
        if dtypes and name in dtypes and t.dtype != dtypes[name]:
            lines.append(f"{where}{what} {name}: expected {dtypes[name]} ({source}), found {t.dtype}")
    return lines


def check_models(
    root: Path,
    models: list[str],
    target: str | None,
    qdq: dict[str, Path] | None = None,
    declared: dict[str, list[Declared]] | None = None,
    somewhere: list[Declared] | None = None,
) -> dict[str, ContextBinary]:
    """Read back every context binary that the EPContext models ``models`` (paths relative to
    ``root``: every compiled model the plan made) reference, and check them:

    - each planned model exists, and each binary holds exactly the graphs of the models that
      reference it, with their inputs and outputs (name, dtype, shape) and the target's SoC model
      (:func:`check`), for the SoC of ``target`` (a name in ``tasks/qnn/targets.py``);
    - ``qdq`` ({model: the QDQ model it was compiled from}): the compiled model's graph inputs
      and outputs are the QDQ graph's (what the ONNX graph said before compile);
    - ``declared`` ({model: [:class:`Declared`]}): every tensor a runtime config (or the
      export's description) names for that model is in its graph in the binary, with its shape
      and, where the declaration gives one (``Declared.dtypes``), its element type;
    - ``somewhere`` ([:class:`Declared`]): every tensor named is an input (output) of at least
      one of ``models``' graphs, with its shape (a runtime's KV names for every layer, which
      live in the part that holds the layer).

    Returns {binary path relative to ``root``: what was read}. Raises Mismatch listing every
    difference (a planned model missing is one), ReadError for a binary libQnnSystem cannot
    read."""
    from tasks.qnn.graphs import load_structure

    root = Path(root)
    lines, found, present = [], {}, []
    for rel in models:
        if not (root / rel).is_file():
            lines.append(f"{rel}: expected (the plan compiles it), found no such file")
        else:
            present.append(rel)
    for rel in present:
        if qdq and rel in qdq:
            before = load_structure(qdq[rel]).graph  # I/O only: its inline weights stay unread
            after = load_structure(root / rel).graph
            for what, b, a in (("input", before.input, after.input), ("output", before.output, after.output)):
                got = _onnx_io(a)
                for n, (dt, shape) in _onnx_io(b).items():
                    g = got.get(n)
                    if g != (dt, shape):
                        lines.append(
                            f"{rel}, {what} {n}: expected {dt} {list(shape)} (the QDQ graph "
                            f"{Path(qdq[rel]).name}), found {'no such tensor' if g is None else f'{g[0]} {list(g[1])}'}"
                        )
    graph_of = {}  # model -> (binary, graph name)
    for rel_bin, expected in planned_graphs(root, present).items():
        path = root / rel_bin
        for e in expected:
            graph_of[e.source] = (rel_bin, e.name)
        if not path.is_file():
            lines.append(
                f"{rel_bin}: expected (named by {', '.join(sorted({e.source for e in expected}))} "
                f"in ep_cache_context), found no such file"
            )
            continue
        binary = read(path)
        found[rel_bin] = binary
        lines += check(binary, expected, target, label=rel_bin)
    for rel, said in sorted((declared or {}).items()):
        for d in said:
            if rel not in graph_of or graph_of[rel][0] not in found:
                if rel not in present and rel not in models:
                    lines.append(f"{rel}: named by {d.source}, found no such compiled model")
                continue
            rel_bin, gname = graph_of[rel]
            g = found[rel_bin].graph(gname)
            if g is None:
                continue  # already a line from check()
            for what, said, have in (("input", d.inputs, g.inputs), ("output", d.outputs, g.outputs)):
                lines += _declared_lines(
                    f"{rel_bin}, graph {gname} ({rel}), ",
                    said,
                    {t.name: t for t in have},
                    what,
                    d.source,
                    f"no such tensor (the graph's {what}s: {', '.join(sorted(t.name for t in have)) or 'none'})",
                    d.dtypes,
                )
    graphs = [found[b].graph(n) for b, n in graph_of.values() if b in found and found[b].graph(n)]
    for d in somewhere or []:
        for what, said in (("input", d.inputs), ("output", d.outputs)):
            have = {t.name: t for g in graphs for t in (g.inputs if what == "input" else g.outputs)}
            lines += _declared_lines(
                "", said, have, what, d.source, f"in none of the graphs of {', '.join(sorted(found))}", d.dtypes
            )
    if lines:
        print(
            "npubuild: context binaries read back, differences:\n  " + "\n  ".join(lines), flush=True
        )  # the stage's log
        raise Mismatch(lines)
    return found
