"""Read a QNN context binary back on the build host (the checks against what the build expects:
:mod:`tasks.qnn.context_binary_checks`).

A context binary is what ships: the file a user copies to a Snapdragon machine. The x86_64 HTP
simulator cannot load a weight-shared binary (two graphs in one file: it segfaults, reproduced by
:func:`tasks.llm.htp.load_shared_probe`),
but ``libQnnSystem.so`` from the onnxruntime-qnn wheel reads any binary's metadata without a
backend or device: ``QnnSystemInterface_getProviders`` -> ``systemContextCreate`` ->
``systemContextGetBinaryInfo``. :func:`read` returns it as plain data (milliseconds for a
36 MB binary): the QNN SDK build id, the SoC model it was prepared for, and per graph its name,
every input and output tensor (name, dtype, shape, bytes) and the HTP backend's figures (spill-fill
buffer, weight bytes, shared weight bytes, I/O bytes).

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

from tasks.errors import InputMissing, UserError

#: QNN ``Qnn_DataType_t`` codes (QnnTypes.h) -> the ONNX TensorProto name of the same element
#: type as seen at a graph's boundary (fixed-point types carry their integer container)
QNN_DTYPES = {
    0x0008: "INT8",
    0x0016: "INT16",
    0x0032: "INT32",
    0x0064: "INT64",
    0x0108: "UINT8",
    0x0116: "UINT16",
    0x0132: "UINT32",
    0x0164: "UINT64",
    0x0216: "FLOAT16",
    0x0232: "FLOAT",
    0x0264: "DOUBLE",
    0x0308: "INT8",
    0x0316: "INT16",
    0x0332: "INT32",  # sfixed-point 8/16/32
    0x0408: "UINT8",
    0x0416: "UINT16",
    0x0432: "UINT32",  # ufixed-point 8/16/32
    0x0508: "BOOL",
}


class ReadError(UserError, RuntimeError):
    """A context binary libQnnSystem could not read (not a context binary, truncated, or a
    binary info version this reader does not know)."""


@dataclass(frozen=True)
class Tensor:
    """One graph input or output: ``dtype`` an ONNX element type name (``FLOAT``, ``INT32``,
    ``UINT16``...; ``0x....`` for a QNN type with none), ``shape`` static dims, ``bytes`` its
    size as libQnnSystem reports it (``systemTensorGetMemoryFootprint``). A fixed-point tensor
    with one scale (QNN's ``QNN_QUANTIZATION_ENCODING_SCALE_OFFSET``) also has ``scale`` and
    ``zero_point`` (value = (integer - zero_point) x scale; QNN stores ``offset`` =
    -zero_point, ``QnnTypes.h`` ``Qnn_ScaleOffset_t``); None otherwise. Neither enters
    equality nor :meth:`ContextBinary.figures`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes: int = 0
    scale: float | None = field(default=None, compare=False)
    zero_point: int | None = field(default=None, compare=False)


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
    ``soc_model`` (QNN's SoC id, ``tasks/qnn/targets.py``'s ``soc_model``), ``bytes`` the file's
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
        I/O bytes and its inputs and outputs ([name, dtype, shape, bytes] each: what a call
        moves across the graph's boundary)."""
        io = lambda ts: [[t.name, t.dtype, list(t.shape), t.bytes] for t in ts]  # noqa: E731
        return {
            "bytes": self.bytes,
            "sdk_build_id": self.sdk_build_id,
            "soc_model": self.soc_model,
            "graphs": {
                g.name: {
                    "weight_bytes": g.weight_bytes,
                    "shared_weight_bytes": g.shared_weight_bytes,
                    "spill_fill_bytes": g.spill_fill_bytes,
                    "io_bytes": g.io_bytes,
                    "inputs": io(g.inputs),
                    "outputs": io(g.outputs),
                }
                for g in self.graphs
            },
        }

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ the QNN structs (x86_64)


class _Version(C.Structure):  # Qnn_Version_t
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class _QuantizeParams(C.Structure):  # Qnn_QuantizeParams_t: 40 bytes, pointer-aligned
    _fields_ = [("encodingDefinition", C.c_uint32), ("quantizationEncoding", C.c_uint32), ("_u", C.c_uint64 * 4)]


class _TensorV1(C.Structure):  # Qnn_TensorV1_t, the prefix Qnn_TensorV2_t shares
    _fields_ = [
        ("id", C.c_uint32),
        ("name", C.c_char_p),
        ("type", C.c_uint32),
        ("dataFormat", C.c_uint32),
        ("dataType", C.c_uint32),
        ("quantizeParams", _QuantizeParams),
        ("rank", C.c_uint32),
        ("dimensions", C.POINTER(C.c_uint32)),
    ]


class _Tensor(C.Structure):  # Qnn_Tensor_t: a version, then the union of V1 / V2 (144 bytes in all)
    _fields_ = [("version", C.c_uint32), ("v1", _TensorV1), ("_rest", C.c_uint8 * (144 - 8 - C.sizeof(_TensorV1)))]


class _GraphInfoV3(C.Structure):  # QnnSystemContext_GraphInfoV3_t (V1 and V2 share its prefix)
    _fields_ = [
        ("graphName", C.c_char_p),
        ("numGraphInputs", C.c_uint32),
        ("graphInputs", C.POINTER(_Tensor)),
        ("numGraphOutputs", C.c_uint32),
        ("graphOutputs", C.POINTER(_Tensor)),
        ("numUpdateableTensors", C.c_uint32),
        ("updateableTensors", C.c_void_p),
        ("graphBlobInfoSize", C.c_uint32),
        ("graphBlobInfo", C.c_void_p),
        ("startOpIndex", C.c_uint32),
        ("endOpIndex", C.c_uint32),
    ]


class _GraphInfo(C.Structure):  # QnnSystemContext_GraphInfo_t (88 bytes)
    _fields_ = [("version", C.c_uint32), ("v", _GraphInfoV3)]


class _BinaryInfoV3(C.Structure):  # QnnSystemContext_BinaryInfoV3_t (V1, V2 share the prefix to `graphs`)
    _fields_ = [
        ("backendId", C.c_uint32),
        ("buildId", C.c_char_p),
        ("coreApiVersion", _Version),
        ("backendApiVersion", _Version),
        ("socVersion", C.c_char_p),
        ("contextBlobVersion", _Version),
        ("contextBlobSize", C.c_uint64),
        ("numContextTensors", C.c_uint32),
        ("contextTensors", C.c_void_p),
        ("numGraphs", C.c_uint32),
        ("graphs", C.POINTER(_GraphInfo)),
        ("platformInfo", C.c_uint8 * 24),
        ("socModel", C.c_uint32),
    ]


class _BinaryInfo(C.Structure):  # QnnSystemContext_BinaryInfo_t
    _fields_ = [("version", C.c_uint32), ("v3", _BinaryInfoV3)]


_ERR = C.c_uint64  # Qnn_ErrorHandle_t


class _SystemFunctions(C.Structure):  # QNN_SYSTEM_INTERFACE_VER_TYPE's first members
    _fields_ = [
        ("systemContextCreate", C.CFUNCTYPE(_ERR, C.POINTER(C.c_void_p))),
        (
            "systemContextGetBinaryInfo",
            C.CFUNCTYPE(
                _ERR, C.c_void_p, C.c_void_p, C.c_uint64, C.POINTER(C.POINTER(_BinaryInfo)), C.POINTER(C.c_uint64)
            ),
        ),
        ("systemContextGetMetaData", C.c_void_p),
        ("systemContextFree", C.CFUNCTYPE(_ERR, C.c_void_p)),
        ("systemTensorGetMemoryFootprint", C.CFUNCTYPE(_ERR, _Tensor, C.POINTER(C.c_uint64))),
    ]


class _SystemInterface(C.Structure):  # QnnSystemInterface_t
    _fields_ = [
        ("backendId", C.c_uint32),
        ("providerName", C.c_char_p),
        ("systemApiVersion", _Version),
        ("fns", _SystemFunctions),
    ]


def library_path() -> Path:
    """``libQnnSystem.so`` of the installed onnxruntime-qnn wheel (``QnnSystem.dll`` on
    Windows). Raises ImportError without onnxruntime-qnn, FileNotFoundError when the wheel
    holds no such library."""
    import onnxruntime_qnn

    folder = Path(onnxruntime_qnn.__file__).parent
    for name in ("libQnnSystem.so", "QnnSystem.dll"):
        if (folder / name).is_file():
            return folder / name
    raise InputMissing(f"no libQnnSystem.so or QnnSystem.dll in {folder} (onnxruntime-qnn)")


@lru_cache(maxsize=1)
def _functions(lib: str) -> _SystemFunctions:
    dll = C.CDLL(lib)
    providers, n = C.POINTER(C.POINTER(_SystemInterface))(), C.c_uint32()
    if dll.QnnSystemInterface_getProviders(C.byref(providers), C.byref(n)) != 0 or not n.value:
        raise ReadError(f"{lib}: QnnSystemInterface_getProviders gave no provider")
    return providers[0].contents.fns


_DEFINED, _SCALE_OFFSET = 1, 0  # QNN_DEFINITION_DEFINED, QNN_QUANTIZATION_ENCODING_SCALE_OFFSET (QnnTypes.h)


def _scale_offset(q: _QuantizeParams) -> tuple[float | None, int | None]:
    """(scale, zero point) of a per-tensor encoding: the union's ``Qnn_ScaleOffset_t`` {float
    scale; int32 offset}, zero point = -offset; (None, None) for any other encoding."""
    if q.encodingDefinition != _DEFINED or q.quantizationEncoding != _SCALE_OFFSET:
        return None, None
    raw = bytes(q._u)[:8]
    scale, offset = C.c_float.from_buffer_copy(raw[:4]).value, C.c_int32.from_buffer_copy(raw[4:]).value
    return scale, -offset


def _tensors(array, count: int, footprint) -> tuple[Tensor, ...]:
    out = []
    for i in range(count):
        t = array[i]
        v = t.v1
        size = C.c_uint64(0)
        nbytes = size.value if footprint(t, C.byref(size)) == 0 else 0
        scale, zp = _scale_offset(v.quantizeParams) if v.dataType >> 8 in (3, 4) else (None, None)  # fixed point
        out.append(
            Tensor(
                v.name.decode(),
                QNN_DTYPES.get(v.dataType, f"0x{v.dataType:04x}"),
                tuple(v.dimensions[d] for d in range(v.rank)),
                nbytes,
                scale,
                zp,
            )
        )
    return tuple(out)


def _htp_figures(ptr: int | None, size: int) -> dict:
    """The HTP graph block: V1 (40 bytes: version 1, spill-fill bytes at 8), then a V2 block
    (version 2 at byte 40; I/O bytes at +32, constants at +48, shared weights at +64)."""
    if not ptr or size < 40 or C.c_uint32.from_address(ptr).value != 1:
        return {}

    def u64(off):
        return C.c_uint64.from_address(ptr + off).value

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
            graphs.append(
                Graph(
                    v.graphName.decode(),
                    _tensors(v.graphInputs, v.numGraphInputs, footprint),
                    _tensors(v.graphOutputs, v.numGraphOutputs, footprint),
                    **htp,
                )
            )
        return ContextBinary(str(path), (b.buildId or b"").decode(), int(b.socModel), size, tuple(graphs))
    finally:
        fns.systemContextFree(handle)
