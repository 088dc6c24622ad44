"""Reading and writing ONNX graphs in stage folders (shared by the stages)."""

from __future__ import annotations

from pathlib import Path

from . import digest
from .errors import UserError
from .proc import lazy

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


def save_model(model: onnx.ModelProto, path: Path) -> None:
    """Save ``model``; its weights go to external data ``<name>.data`` above 2 GB."""
    path = Path(path)
    try:
        big = model.ByteSize() > TWO_GB
    except ValueError:  # protobuf refuses to measure past 2 GB
        big = True
    if big:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def list_graphs(folder: Path) -> list[Path]:
    """The ``*.onnx`` files under ``folder``, sorted by relative path."""
    return [p for p in digest.list_files(folder) if p.suffix == ".onnx"]
