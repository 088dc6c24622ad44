"""The compiled Genie context binaries: graph names patched into them (:func:`rename_graph`,
:func:`rename_graphs`; Genie orders the splits by the name) and their read-back through
libQnnSystem against ``genie_export.json`` (:func:`check_binaries`)."""

from __future__ import annotations

from pathlib import Path


def rename_graph(bin_path, name: str) -> str:
    """Give the one graph in context binary ``bin_path`` the name ``name``, in place; returns the
    old name. A workaround: onnxruntime's QNN EP names a compiled graph
    ``QNNExecutionProvider_QNNExecutionProvider_<hash of the model path>_1_0`` (no option sets
    it; ``ep.context_node_name_prefix`` did not), and Genie orders the splits of one (AR, CL) by
    ``<prefix>_<i>_of_<N>`` in the graph name, putting other names after them in string order
    (its log: "does not follow the expected split naming"); with ORT's names part 1's prompt
    graph came first and GenieDialog_create failed ("logits - Tensor not found"). The name is
    stored as plain bytes (3 times in our binaries); it is replaced by ``name`` left-padded with
    ``_`` to the same length, so no offset in the binary moves. Checked on the x86_64 simulator
    (QnnContext_createFromBinary accepts it, 2-part tokens = transformers); not on a device.
    Raises ValueError when the binary does not hold exactly one ORT graph name or ``name`` is
    longer than it."""
    import re

    p = Path(bin_path)
    data = p.read_bytes()
    names = set(re.findall(rb"QNNExecutionProvider_QNNExecutionProvider_\d+_\d+_\d+", data))
    if len(names) != 1:
        raise ValueError(f"{p}: expected one onnxruntime graph name, found {sorted(names)}")
    old = names.pop()
    if len(name) > len(old):
        raise ValueError(f"graph name {name!r} is longer than {old.decode()!r}")
    p.write_bytes(data.replace(old, name.encode().rjust(len(old), b"_")))
    return old.decode()


def rename_graphs(bin_path, names: dict[str, str]) -> dict[str, str]:
    """Give the graphs of context binary ``bin_path`` new names, in place: ``names`` maps each
    onnxruntime graph name in it (the EPContext node's name in its ``_ctx.onnx``) to the new
    one (a weight-shared binary holds two). Each is written as :func:`rename_graph` does:
    ``_``-padded on the left to the old length, so no offset moves; the name libQnnSystem and
    Genie read is that padded one (Genie takes the split from its ``_{i}_of_{N}`` end). Returns
    {old: name as written}. Raises ValueError when an old name is not in the binary exactly
    as often as the others' (every ORT name is stored the same number of times) or a new name
    is longer than its old one."""
    p = Path(bin_path)
    data = p.read_bytes()
    written, counts = {}, set()
    for old, new in names.items():
        o = old.encode()
        counts.add(data.count(o))
        if not data.count(o):
            raise ValueError(f"{p}: expected graph name {old!r} in the binary, found it 0 times")
        if len(new) > len(o):
            raise ValueError(f"{p}: graph name {new!r} is longer than {old!r} ({len(new)} > {len(o)} bytes)")
        written[old] = new.rjust(len(o), "_")
        data = data.replace(o, written[old].encode())
    if len(counts) != 1:
        raise ValueError(f"{p}: expected every onnxruntime graph name the same number of times, found {sorted(counts)}")
    p.write_bytes(data)
    return written


#: genie_export.json dtypes (numpy names) -> the ONNX names tasks.qnn.context_binary reports
_ONNX_DTYPE = {"float32": "FLOAT", "int32": "INT32", "float16": "FLOAT16", "uint8": "UINT8", "uint16": "UINT16"}


def expected_graph(desc: dict, name: str, source: str = "genie_export.json"):
    """``tasks.qnn.context_binary_checks.Expected`` for graph ``name`` of a :func:`tasks.llm.genie.graphs.export_genie`
    description:
    its inputs and outputs (ONNX dtype name, shape). Raises KeyError for a name no part has."""
    from tasks.qnn.context_binary_checks import Expected

    for p in desc["parts"]:
        for kind in ("prompt", "token"):
            if p[kind]["graph"] == name:
                io = lambda ts: {t["name"]: (_ONNX_DTYPE[t["dtype"]], tuple(t["shape"])) for t in ts}  # noqa: E731
                return Expected(name, io(p[kind]["inputs"]), io(p[kind]["outputs"]), source)
    raise KeyError(f"{source}: no graph {name!r}")


def check_binaries(
    root, plan: dict[str, list[str]], desc: dict, target: str, source: str = "genie_export.json"
) -> dict:
    """Read back the Genie context binaries ``plan`` names ({path relative to ``root``: graph
    names}) through libQnnSystem (:func:`tasks.qnn.context_binary.read`) and check each: it exists,
    holds exactly those graphs (a graph name as written by :func:`rename_graphs`, its ``_``
    padding stripped), each with the inputs and outputs ``desc`` (``genie_export.json``)
    declares (name, dtype, shape), prepared for ``target``'s SoC model (``tasks/qnn/targets.py``). Returns {binary:
    figures, with ``"graph_names"``: the names as libQnnSystem read them}. Raises
    ``tasks.qnn.context_binary_checks.Mismatch``, one line per difference."""
    from dataclasses import replace

    from tasks.qnn import context_binary
    from tasks.qnn import context_binary_checks

    root, lines, found = Path(root), [], {}
    for rel, graphs in sorted(plan.items()):
        if not (root / rel).is_file():
            lines.append(f"{rel}: expected (Genie binary of graphs {', '.join(graphs)}), found no such file")
            continue
        b = context_binary.read(root / rel)
        stripped = replace(b, graphs=tuple(replace(g, name=g.name.lstrip("_")) for g in b.graphs))
        lines += context_binary_checks.check(
            stripped, [expected_graph(desc, g, source) for g in graphs], target, label=rel
        )
        found[rel] = {**b.figures(), "graph_names": [g.name for g in b.graphs]}
    if lines:
        print("npubuild: Genie context binaries read back, differences:\n  " + "\n  ".join(lines), flush=True)
        raise context_binary_checks.Mismatch(lines)
    return found
