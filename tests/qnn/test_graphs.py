"""tasks/qnn/graphs.py: a model's structure read without its initializers' values."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tasks.qnn.graphs import GraphError, load_structure


def _model(weight_rows: int = 64):
    w = numpy_helper.from_array(np.arange(weight_rows * 256, dtype=np.float32).reshape(weight_rows, 256) / 7, "w")
    q = helper.make_tensor("q4", TensorProto.INT4, [4, 2], [1, -2, 3, -4, 5, -6, 7, -8])
    ids = numpy_helper.from_array(np.array([3, 1], dtype=np.int64), "ids")
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([2.5]), "cv")),
        helper.make_node("Gather", ["w", "ids"], ["g"], name="gather"),
        helper.make_node("Mul", ["g", "c"], ["y"], name="mul"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 256])],
        initializer=[w, q, ids],
        value_info=[helper.make_tensor_value_info("g", TensorProto.FLOAT, [2, 256])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_structure_keeps_every_node_and_io_and_each_initializers_name_type_and_dims_not_its_values(tmp_path):
    m = _model()
    onnx.save(m, tmp_path / "m.onnx")
    s = load_structure(tmp_path / "m.onnx")
    assert [n.SerializeToString() for n in s.graph.node] == [n.SerializeToString() for n in m.graph.node]
    assert (s.graph.input, s.graph.output, s.graph.value_info, s.opset_import, s.ir_version) == (
        m.graph.input,
        m.graph.output,
        m.graph.value_info,
        m.opset_import,
        m.ir_version,
    )
    assert [(t.name, list(t.dims), t.data_type) for t in s.graph.initializer] == [
        ("w", [64, 256], TensorProto.FLOAT),
        ("q4", [4, 2], TensorProto.INT4),
        ("ids", [2], TensorProto.INT64),
    ]
    assert all(not (t.raw_data or t.float_data or t.int32_data or t.int64_data) for t in s.graph.initializer)
    # the Constant node's tensor is part of the node: kept whole
    assert numpy_helper.to_array(s.graph.node[0].attribute[0].t).tolist() == [2.5]
    assert s.ByteSize() < 1000 < m.ByteSize()


def test_external_data_references_are_kept(tmp_path):
    onnx.save(_model(), tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=64)
    s = load_structure(tmp_path / "m.onnx")
    w = next(t for t in s.graph.initializer if t.name == "w")
    assert w.data_location == TensorProto.EXTERNAL and {e.key: e.value for e in w.external_data}["location"] == "m.data"


def test_a_truncated_or_foreign_file_is_one_error_naming_it(tmp_path):
    onnx.save(_model(), tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.onnx").write_text("not a model\n")
    (tmp_path / "empty.onnx").write_bytes(b"")
    for name in ("cut.onnx", "text.onnx", "empty.onnx"):
        with pytest.raises(GraphError, match=rf"{name}: not a valid ONNX model"):
            load_structure(tmp_path / name)


#: bytes the peak RSS grew by while the model loaded (VmHWM: this process's own high-water
#: mark; ru_maxrss would carry the parent's across exec)
PEAK = """
import sys
from tasks.qnn.graphs import load_structure
import onnx
def hwm():
    line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
before = hwm()
m = load_structure(sys.argv[1]) if sys.argv[2] == "structure" else onnx.load(sys.argv[1])
assert len(m.graph.node) == 3
print(hwm() - before)
"""


def test_structure_of_a_300_mb_graph_takes_no_memory_for_its_weights(tmp_path):
    """What it is for: the weights inline in a QDQ graph are not parsed into the process."""
    onnx.save(_model(weight_rows=300 * 1024), tmp_path / "big.onnx")  # 300 Mi float32 values / 256 = 300 MiB
    grew = {
        how: int(
            subprocess.run(
                [sys.executable, "-c", PEAK, str(tmp_path / "big.onnx"), how],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        for how in ("structure", "onnx")
    }
    assert grew["onnx"] > 300 << 20 and grew["structure"] < 30 << 20, grew  # measured: 600 MiB vs 2 MiB
