"""Read a QNN context binary back on the build host, and check it against what the build expects.

A context binary is what ships: the file a user copies to a Snapdragon machine. The x86_64 HTP
simulator cannot load a weight-shared binary (two graphs in one file; ../shared/NOTES-qnn.md),
but ``libQnnSystem.so`` from the onnxruntime-qnn wheel reads any binary's metadata without a
backend or device: ``QnnSystemInterface_getProviders`` -> ``systemContextCreate`` ->
``systemContextGetBinaryInfo``. :func:`read` returns it as plain data (milliseconds for a
36 MB binary): the QNN SDK build id, the SoC model it was prepared for, and per graph its name,
every input and output tensor (name, dtype, shape, bytes) and the HTP backend's figures (spill-fill
buffer, weight bytes, shared weight bytes, I/O bytes).

:func:`check` compares a binary with the graphs the build planned (the EPContext models that
reference it, whose I/O is the QDQ graph's), a runtime config's tensors, and the target's SoC
model; every difference is one :class:`Mismatch` line naming binary, graph, tensor, expected and
found.

Struct layouts are those of the public QNN headers (``QnnSystemInterface.h``,
``QnnSystemContext.h``, ``QnnTypes.h``, QNN 2.43: System API 1.7, core API 2.32; offsets taken with
``offsetof`` on x86_64) and were checked against binaries of onnxruntime-qnn 2.7.0 (QNN 2.51). The
HTP graph block (``QnnHtpSystemContext_GraphBlobInfo_t``) is a documented V1 block of 40 bytes
followed, in these binaries, by a version-2 block whose field order was inferred from its bytes
(consistent across the encoder and LLM binaries read here); its figures are reported, never
judged.
"""

from __future__ import annotations

import ctypes as C
import mmap
import os
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

#: QNN ``Qnn_DataType_t`` codes (QnnTypes.h) -> the ONNX TensorProto name of the same element
#: type as seen at a graph's boundary (fixed-point types carry their integer container)
QNN_DTYPES = {
    0x0008: "INT8", 0x0016: "INT16", 0x0032: "INT32", 0x0064: "INT64",
    0x0108: "UINT8", 0x0116: "UINT16", 0x0132: "UINT32", 0x0164: "UINT64",
    0x0216: "FLOAT16", 0x0232: "FLOAT", 0x0264: "DOUBLE",
    0x0308: "INT8", 0x0316: "INT16", 0x0332: "INT32",      # sfixed-point 8/16/32
    0x0408: "UINT8", 0x0416: "UINT16", 0x0432: "UINT32",   # ufixed-point 8/16/32
    0x0508: "BOOL",
}


class ReadError(RuntimeError):
    """A context binary libQnnSystem could not read (not a context binary, truncated, or a
    binary info version this reader does not know)."""


class Mismatch(RuntimeError):
    """A context binary differs from what the build expects: one line per difference, each
    naming the binary, the graph, the tensor, what was expected and what was found."""

    def __init__(self, lines: list[str]):
        self.lines = list(lines)
        super().__init__(self.lines[0] + (f" (and {len(self.lines) - 1} more: see the log)" if len(self.lines) > 1 else ""))


@dataclass(frozen=True)
class Tensor:
    """One graph input or output: ``dtype`` an ONNX element type name (``FLOAT``, ``INT32``,
    ``UINT16``...; ``0x....`` for a QNN type with none), ``shape`` static dims, ``bytes`` its
    size as libQnnSystem reports it (``systemTensorGetMemoryFootprint``)."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int = 0


@dataclass(frozen=True)
class Graph:
    """One graph of a context binary. Byte figures are the HTP backend's (None when the binary
    carries no HTP block): ``weight_bytes`` its constant data (``constSize``),
    ``shared_weight_bytes`` the part of it shared with the binary's other graphs
    (``sharedWeightsSize``), ``spill_fill_bytes`` the spill-fill buffer in DDR, ``io_bytes``
    its I/O tensors (``ioTensorSize``)."""
    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    weight_bytes: int | None = None
    shared_weight_bytes: int | None = None
    spill_fill_bytes: int | None = None
    io_bytes: int | None = None


@dataclass(frozen=True)
class ContextBinary:
    """What :func:`read` found in one binary: ``sdk_build_id`` (e.g. ``v2.51.0.260929181845``),
    ``soc_model`` (QNN's SoC id, ``tasks/targets.py``'s ``soc_model``), ``bytes`` the file's
    size, ``graphs`` in the binary's order."""
    path: str
    sdk_build_id: str
    soc_model: int
    bytes: int
    graphs: tuple[Graph, ...] = field(default_factory=tuple)

    def graph(self, name: str) -> Graph | None:
        return next((g for g in self.graphs if g.name == name), None)

    def figures(self) -> dict:
        """The figures a model card and ``verify.json`` show for this binary (JSON-able):
        size, SDK build id, SoC model, and per graph its weight, shared weight, spill-fill and
        I/O bytes."""
        return {"bytes": self.bytes, "sdk_build_id": self.sdk_build_id, "soc_model": self.soc_model,
                "graphs": {g.name: {"weight_bytes": g.weight_bytes, "shared_weight_bytes": g.shared_weight_bytes,
                                    "spill_fill_bytes": g.spill_fill_bytes, "io_bytes": g.io_bytes}
                           for g in self.graphs}}

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the QNN structs (x86_64)

class _Version(C.Structure):  # Qnn_Version_t
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class _QuantizeParams(C.Structure):  # Qnn_QuantizeParams_t: 40 bytes, pointer-aligned
    _fields_ = [("encodingDefinition", C.c_uint32), ("quantizationEncoding", C.c_uint32), ("_u", C.c_uint64 * 4)]


class _TensorV1(C.Structure):  # Qnn_TensorV1_t, the prefix Qnn_TensorV2_t shares
    _fields_ = [("id", C.c_uint32), ("name", C.c_char_p), ("type", C.c_uint32), ("dataFormat", C.c_uint32),
                ("dataType", C.c_uint32), ("quantizeParams", _QuantizeParams), ("rank", C.c_uint32),
                ("dimensions", C.POINTER(C.c_uint32))]


class _Tensor(C.Structure):  # Qnn_Tensor_t: a version, then the union of V1 / V2 (144 bytes in all)
    _fields_ = [("version", C.c_uint32), ("v1", _TensorV1), ("_rest", C.c_uint8 * (144 - 8 - C.sizeof(_TensorV1)))]


class _GraphInfoV3(C.Structure):  # QnnSystemContext_GraphInfoV3_t (V1 and V2 share its prefix)
    _fields_ = [("graphName", C.c_char_p), ("numGraphInputs", C.c_uint32), ("graphInputs", C.POINTER(_Tensor)),
                ("numGraphOutputs", C.c_uint32), ("graphOutputs", C.POINTER(_Tensor)),
                ("numUpdateableTensors", C.c_uint32), ("updateableTensors", C.c_void_p),
                ("graphBlobInfoSize", C.c_uint32), ("graphBlobInfo", C.c_void_p),
                ("startOpIndex", C.c_uint32), ("endOpIndex", C.c_uint32)]


class _GraphInfo(C.Structure):  # QnnSystemContext_GraphInfo_t (88 bytes)
    _fields_ = [("version", C.c_uint32), ("v", _GraphInfoV3)]


class _BinaryInfoV3(C.Structure):  # QnnSystemContext_BinaryInfoV3_t (V1, V2 share the prefix to `graphs`)
    _fields_ = [("backendId", C.c_uint32), ("buildId", C.c_char_p), ("coreApiVersion", _Version),
                ("backendApiVersion", _Version), ("socVersion", C.c_char_p), ("contextBlobVersion", _Version),
                ("contextBlobSize", C.c_uint64), ("numContextTensors", C.c_uint32), ("contextTensors", C.c_void_p),
                ("numGraphs", C.c_uint32), ("graphs", C.POINTER(_GraphInfo)), ("platformInfo", C.c_uint8 * 24),
                ("socModel", C.c_uint32)]


class _BinaryInfo(C.Structure):  # QnnSystemContext_BinaryInfo_t
    _fields_ = [("version", C.c_uint32), ("v3", _BinaryInfoV3)]


_ERR = C.c_uint64  # Qnn_ErrorHandle_t


class _SystemFunctions(C.Structure):  # QNN_SYSTEM_INTERFACE_VER_TYPE's first members
    _fields_ = [("systemContextCreate", C.CFUNCTYPE(_ERR, C.POINTER(C.c_void_p))),
                ("systemContextGetBinaryInfo", C.CFUNCTYPE(_ERR, C.c_void_p, C.c_void_p, C.c_uint64,
                                                           C.POINTER(C.POINTER(_BinaryInfo)), C.POINTER(C.c_uint64))),
                ("systemContextGetMetaData", C.c_void_p),
                ("systemContextFree", C.CFUNCTYPE(_ERR, C.c_void_p)),
                ("systemTensorGetMemoryFootprint", C.CFUNCTYPE(_ERR, _Tensor, C.POINTER(C.c_uint64)))]


class _SystemInterface(C.Structure):  # QnnSystemInterface_t
    _fields_ = [("backendId", C.c_uint32), ("providerName", C.c_char_p), ("systemApiVersion", _Version),
                ("fns", _SystemFunctions)]


def library_path() -> Path:
    """``libQnnSystem.so`` of the installed onnxruntime-qnn wheel (``QnnSystem.dll`` on
    Windows). Raises ImportError without onnxruntime-qnn, FileNotFoundError when the wheel
    holds no such library."""
    import onnxruntime_qnn

    folder = Path(onnxruntime_qnn.__file__).parent
    for name in ("libQnnSystem.so", "QnnSystem.dll"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no libQnnSystem.so or QnnSystem.dll in {folder} (onnxruntime-qnn)")


@lru_cache(maxsize=1)
def _functions(lib: str) -> _SystemFunctions:
    dll = C.CDLL(lib)
    providers, n = C.POINTER(C.POINTER(_SystemInterface))(), C.c_uint32()
    if dll.QnnSystemInterface_getProviders(C.byref(providers), C.byref(n)) != 0 or not n.value:
        raise ReadError(f"{lib}: QnnSystemInterface_getProviders gave no provider")
    return providers[0].contents.fns


def _tensors(array, count: int, footprint) -> tuple[Tensor, ...]:
    out = []
    for i in range(count):
        t = array[i]
        v = t.v1
        size = C.c_uint64(0)
        nbytes = size.value if footprint(t, C.byref(size)) == 0 else 0
        out.append(Tensor(v.name.decode(), QNN_DTYPES.get(v.dataType, f"0x{v.dataType:04x}"),
                          tuple(v.dimensions[d] for d in range(v.rank)), nbytes))
    return tuple(out)


def _htp_figures(ptr: int | None, size: int) -> dict:
    """The HTP graph block: V1 (40 bytes: version 1, spill-fill bytes at 8), then a V2 block
    (version 2 at byte 40; I/O bytes at +32, constants at +48, shared weights at +64)."""
    if not ptr or size < 40 or C.c_uint32.from_address(ptr).value != 1:
        return {}
    u64 = lambda off: C.c_uint64.from_address(ptr + off).value
    out = {"spill_fill_bytes": u64(8)}
    if size >= 112 and C.c_uint32.from_address(ptr + 40).value == 2:
        out.update(io_bytes=u64(72), weight_bytes=u64(88), shared_weight_bytes=u64(104))
    return out


def read(path: Path | str) -> ContextBinary:
    """Read the metadata of context binary ``path`` (``*.bin`` as onnxruntime-qnn writes with
    ``ep.context_embed_mode=0``). Any binary, weight-shared ones included; no backend, device
    or simulator is loaded. Raises OSError for an unreadable file, ReadError when
    libQnnSystem refuses it (not a context binary, truncated) or reports a binary info
    version other than 3 (QNN >= 2.2x)."""
    path = Path(path)
    fns = _functions(str(library_path()))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ReadError(f"{path.name}: empty file, not a QNN context binary")
        # mapped, not read: a 7B part's binary is ~1.3 GB; libQnnSystem pages in what it parses.
        # ACCESS_COPY gives the writable buffer ctypes needs; nothing is written.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        buf = (C.c_char * size).from_buffer(mm)
        try:
            return _parse(fns, path, C.addressof(buf), size)
        finally:
            del buf
    finally:
        mm.close()


def _parse(fns: _SystemFunctions, path: Path, address: int, size: int) -> ContextBinary:
    handle = C.c_void_p()
    if fns.systemContextCreate(C.byref(handle)) != 0:
        raise ReadError("libQnnSystem: systemContextCreate failed")
    try:
        info, info_size = C.POINTER(_BinaryInfo)(), C.c_uint64()
        err = fns.systemContextGetBinaryInfo(handle, address, size, C.byref(info), C.byref(info_size))
        if err or not info:
            raise ReadError(f"{path.name}: not a QNN context binary libQnnSystem can read (error {err})")
        if info.contents.version != 3:
            raise ReadError(f"{path.name}: binary info version {info.contents.version}; this reader knows 3")
        b = info.contents.v3
        graphs = []
        for gi in range(b.numGraphs):
            g = b.graphs[gi]
            if g.version not in (1, 2, 3):
                raise ReadError(f"{path.name}: graph info version {g.version}; this reader knows 1-3")
            v = g.v
            htp = _htp_figures(v.graphBlobInfo, v.graphBlobInfoSize) if g.version == 3 else {}
            footprint = fns.systemTensorGetMemoryFootprint
            graphs.append(Graph(v.graphName.decode(), _tensors(v.graphInputs, v.numGraphInputs, footprint),
                                _tensors(v.graphOutputs, v.numGraphOutputs, footprint), **htp))
        return ContextBinary(str(path), (b.buildId or b"").decode(), int(b.socModel), size, tuple(graphs))
    finally:
        fns.systemContextFree(handle)


# ------------------------------------------------------------------ what the build expects

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
        out[v.name] = (onnx.TensorProto.DataType.Name(t.elem_type),
                       tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim))
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
                Expected(n.name, {i: typed[i] for i in n.input if i in typed},
                         {o: typed[o] for o in n.output if o in typed}, rel))
    return out


def _io_lines(where: str, expected: dict, found: tuple[Tensor, ...], what: str) -> list[str]:
    have = {t.name: t for t in found}
    lines = []
    for name, (dtype, shape) in expected.items():
        t = have.get(name)
        if t is None:
            lines.append(f"{where}, {what} {name}: expected {dtype} {list(shape)}, found no such tensor "
                         f"(the graph's {what}s: {', '.join(sorted(have)) or 'none'})")
        elif t.dtype != dtype or tuple(t.shape) != tuple(shape):
            lines.append(f"{where}, {what} {name}: expected {dtype} {list(shape)}, found {t.dtype} {list(t.shape)}")
    return lines


def check(binary: ContextBinary, expected: list[Expected], target: str | None = None,
          exact_graphs: bool = True, label: str | None = None) -> list[str]:
    """Differences between ``binary`` and the graphs it must hold: each graph of ``expected``
    present (by name) with every input and output of the same name, dtype and shape;
    with ``exact_graphs``, no graph beside them; and the SoC model of ``target`` (a name in
    ``tasks/targets.py``). ``label``: how lines name the binary (default its file name).
    Returns one line per difference (empty: the binary is as planned)."""
    from .targets import get as get_target

    name = label or Path(binary.path).name
    lines = []
    soc_model = get_target(target).soc_model if target is not None else None
    if soc_model is not None and binary.soc_model != soc_model:
        lines.append(f"{name}: SoC model expected {soc_model} ({target}), found {binary.soc_model} "
                     f"(the binary was prepared for another SoC)")
    for e in expected:
        g = binary.graph(e.name)
        if g is None:
            lines.append(f"{name}, graph {e.name} (from {e.source}): expected in the binary, found graphs "
                         f"{', '.join(x.name for x in binary.graphs) or 'none'}")
            continue
        where = f"{name}, graph {e.name}"
        lines += _io_lines(where, e.inputs, g.inputs, "input") + _io_lines(where, e.outputs, g.outputs, "output")
    if exact_graphs:
        extra = sorted({g.name for g in binary.graphs} - {e.name for e in expected})
        for x in extra:
            lines.append(f"{name}, graph {x}: expected no such graph (planned: "
                         f"{', '.join(e.name for e in expected)}), found it in the binary")
    return lines


@dataclass(frozen=True)
class Declared:
    """What a runtime config declares of one compiled model's graph (e.g. ``genai_config.json``
    for a pipeline entry): tensor name -> shape (None: the config gives no shape) per direction,
    and which file says so."""
    inputs: dict[str, tuple[int, ...] | None]
    outputs: dict[str, tuple[int, ...] | None]
    source: str


def _declared_lines(where: str, said: dict, have: dict[str, Tensor], what: str, source: str,
                    missing: str) -> list[str]:
    """Lines for the tensors ``said`` ({name: shape or None}) that ``have`` ({name: Tensor})
    lacks (``found {missing}``) or holds with another shape; ``where`` prefixes each line."""
    lines = []
    for name, shape in sorted(said.items()):
        t = have.get(name)
        if t is None:
            lines.append(f"{where}{what} {name}: expected (named by {source}), found {missing}")
        elif shape is not None and tuple(t.shape) != tuple(shape):
            lines.append(f"{where}{what} {name}: expected shape {list(shape)} ({source}), found {list(t.shape)}")
    return lines


def check_models(root: Path, models: list[str], target: str | None, qdq: dict[str, Path] | None = None,
                 declared: dict[str, list[Declared]] | None = None,
                 somewhere: list[Declared] | None = None) -> dict[str, ContextBinary]:
    """Read back every context binary that the EPContext models ``models`` (paths relative to
    ``root``: every compiled model the plan made) reference, and check them:

    - each planned model exists, and each binary holds exactly the graphs of the models that
      reference it, with their inputs and outputs (name, dtype, shape) and the target's SoC model
      (:func:`check`), for the SoC of ``target`` (a name in ``tasks/targets.py``);
    - ``qdq`` ({model: the QDQ model it was compiled from}): the compiled model's graph inputs
      and outputs are the QDQ graph's (what the ONNX graph said before compile);
    - ``declared`` ({model: [:class:`Declared`]}): every tensor a runtime config (or the
      export's description) names for that model is in its graph in the binary, with its shape;
    - ``somewhere`` ([:class:`Declared`]): every tensor named is an input (output) of at least
      one of ``models``' graphs, with its shape (a runtime's KV names for every layer, which
      live in the part that holds the layer).

    Returns {binary path relative to ``root``: what was read}. Raises Mismatch listing every
    difference (a planned model missing is one), ReadError for a binary libQnnSystem cannot
    read."""
    import onnx

    root = Path(root)
    lines, found, present = [], {}, []
    for rel in models:
        if not (root / rel).is_file():
            lines.append(f"{rel}: expected (the plan compiles it), found no such file")
        else:
            present.append(rel)
    for rel in present:
        if qdq and rel in qdq:
            before = onnx.load(str(qdq[rel]), load_external_data=False).graph
            after = onnx.load(str(root / rel), load_external_data=False).graph
            for what, b, a in (("input", before.input, after.input), ("output", before.output, after.output)):
                got = _onnx_io(a)
                for n, (dt, shape) in _onnx_io(b).items():
                    g = got.get(n)
                    if g != (dt, shape):
                        lines.append(f"{rel}, {what} {n}: expected {dt} {list(shape)} (the QDQ graph "
                                     f"{Path(qdq[rel]).name}), found {'no such tensor' if g is None else f'{g[0]} {list(g[1])}'}")
    graph_of = {}  # model -> (binary, graph name)
    for rel_bin, expected in planned_graphs(root, present).items():
        path = root / rel_bin
        for e in expected:
            graph_of[e.source] = (rel_bin, e.name)
        if not path.is_file():
            lines.append(f"{rel_bin}: expected (named by {', '.join(sorted({e.source for e in expected}))} "
                         f"in ep_cache_context), found no such file")
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
                lines += _declared_lines(f"{rel_bin}, graph {gname} ({rel}), ", said, {t.name: t for t in have}, what,
                                         d.source, f"no such tensor (the graph's {what}s: "
                                                   f"{', '.join(sorted(t.name for t in have)) or 'none'})")
    graphs = [found[b].graph(n) for b, n in graph_of.values() if b in found and found[b].graph(n)]
    for d in somewhere or []:
        for what, said in (("input", d.inputs), ("output", d.outputs)):
            have = {t.name: t for g in graphs for t in (g.inputs if what == "input" else g.outputs)}
            lines += _declared_lines("", said, have, what, d.source,
                                     f"in none of the graphs of {', '.join(sorted(found))}")
    if lines:
        print("npubuild: context binaries read back, differences:\n  " + "\n  ".join(lines), flush=True)  # the stage's log
        raise Mismatch(lines)
    return found
