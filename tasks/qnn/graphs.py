"""Reading and writing ONNX graphs in stage folders (shared by the stages)."""

from __future__ import annotations

from pathlib import Path

from tasks.store import digest
from tasks.errors import UserError
from tasks.proc import lazy

onnx = lazy.module("onnx")

TWO_GB = 2 * 1024**3  # protobuf's message size limit


class GraphError(UserError):
    """A file that should be an ONNX model is not one (corrupt, truncated, wrong file)."""


def load_model(path: Path, load_external_data: bool = True) -> onnx.ModelProto:
    """``onnx.load`` with an error that names the file. Raises GraphError (ImportError as
    itself: a library that did not import says nothing about the file)."""
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except ImportError:  # onnx or numpy failed to import (e.g. interrupted): not the file's fault
        raise
    except Exception as e:
        raise GraphError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None


#: protobuf field numbers (onnx.proto3): ModelProto.graph, GraphProto.initializer, and the
#: TensorProto fields that hold a tensor's values (float_data, int32_data, string_data,
#: int64_data, raw_data, double_data, uint64_data)
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_VALUES = frozenset({4, 5, 6, 7, 9, 10, 11})


def load_structure(path: Path) -> onnx.ModelProto:
    """The model in ``path`` with its initializers' values left unread: every node, input,
    output, value_info and opset as ``onnx.load`` gives them, each initializer with its name,
    dims and data_type but no data (``raw_data`` and the typed ``*_data`` fields empty; its
    external-data reference kept). Reading values from it gives empty arrays: it serves
    questions about the graph (op counts, I/O, which initializer is which type).

    Why: a QDQ graph of a 7B part holds ~1 GB of weights inline; ``onnx.load`` parses them
    into memory that glibc's allocator keeps in the process after the model is freed (the
    doit process held 3-4 GiB between LLM stages, benchmarks/README.md). This walks the
    protobuf wire format over a memory map (https://protobuf.dev/programming-guides/encoding/)
    and parses only what it keeps. Raises GraphError for a file that is not a protobuf
    ModelProto (truncated, wrong file)."""
    import mmap

    def varint(b, i):
        shift = out = 0
        while True:
            c = b[i]
            i += 1
            out |= (c & 0x7F) << shift
            if c < 0x80:
                return out, i
            shift += 7
            if shift > 63:
                raise ValueError("varint longer than 10 bytes")

    def fields(b, i, end):
        """(field number, start of the field's tag, start of its payload, end) per field."""
        while i < end:
            start = i
            tag, i = varint(b, i)
            num, wire = tag >> 3, tag & 7
            if wire == 0:
                _, i = varint(b, i)
                yield num, start, i, i
                continue
            if wire == 2:
                n, j = varint(b, i)
                i = j + n
                yield num, start, j, i
            elif wire in (1, 5):
                i += 8 if wire == 1 else 4
                yield num, start, i, i
            else:
                raise ValueError(f"wire type {wire} (groups) at byte {start}")
            if i > end:
                raise ValueError(f"field {num} at byte {start} runs past its message's end")

    def enc(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    def message(num, body):
        return enc(num << 3 | 2) + enc(len(body)) + body

    def keep(b, i, end, rewrite):
        parts = []
        for num, start, j, stop in fields(b, i, end):
            new = rewrite(num, b, j, stop)
            parts.append(b[start:stop] if new is None else new)
        return b"".join(parts)

    def tensor(num, b, j, stop):
        return b"" if num in _TENSOR_VALUES else None

    def graph(num, b, j, stop):
        return message(num, keep(b, j, stop, tensor)) if num == _GRAPH_INITIALIZER else None

    def model(num, b, j, stop):
        return message(num, keep(b, j, stop, graph)) if num == _MODEL_GRAPH else None

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                data = keep(view, 0, len(mm), model)
            finally:
                view.release()
        return onnx.ModelProto.FromString(data)
    except ImportError:
        raise
    except Exception as e:
        raise GraphError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Save ``model``; its weights go to external data ``<name>.data`` above 2 GB."""
    path = Path(path)
    try:
        big = model.ByteSize() > TWO_GB
    except ValueError:  # protobuf refuses to measure past 2 GB
        big = True
    if big:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, str(path))


def list_graphs(folder: Path) -> list[Path]:
    """The ``*.onnx`` files under ``folder``, sorted by relative path."""
    return [p for p in digest.list_files(folder) if p.suffix == ".onnx"]
