"""A minimal case (run by hand; no project code): onnxruntime-qnn 2.7.0's HTP simulator (x86_64)
SIGSEGVs at the first run of a uint16 x int4 LPBQ MatMul whose in-features K hold 7 to 9 blocks
of 64 or more (K=1024 at block 128: a Qwen2 of hidden size 1024, the 0.86 B benchmark shape).

    .venv/bin/python benchmarks/lpbq_sim_crash.py K N BLOCK   # exit -11 (139 in a shell): the crash

Measured 2026-12-07 (N=128 unless said): 896, 1024, 1152 at block 128, 448-576 at block 64,
2048 and 2304 at block 256 crash every time (N 64 to 4864 alike); 3-6, 10-12, 16 and 38 blocks
run, as do 7-8 blocks of 32, plain block-wise int4 and per-channel int4. gdb: a 128-byte vector
store on a simulator worker thread lands on the guard page after the simulated VTCM
(nn_os_vtcm_hmx_acquire). vtcm_mb, the finalization mode, burst and the other targets change
nothing. The graph: DequantizeLinear of the uint8 block scales x a per-channel float scale (LPBQ,
tasks/qnn/weights.py), DequantizeLinear of the int4 weight by block, MatMul, QuantizeLinear."""

import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

K, N, B = (int(a) for a in sys.argv[1:4])
rng = np.random.default_rng(0)
init = [
    nh.from_array(np.array(1.25e-4, np.float32), "xs"),
    nh.from_array(np.array(32768, np.uint16), "xz"),
    nh.from_array(np.array(6.6e-5, np.float32), "ys"),
    nh.from_array(np.array(32768, np.uint16), "yz"),
    h.make_tensor("wq", T.INT4, (K, N), rng.integers(-8, 8, K * N).tolist()),
    h.make_tensor("wz", T.INT4, (K // B, N), [0] * (K // B * N)),
    nh.from_array(rng.integers(1, 17, (K // B, N)).astype(np.uint8), "bint"),  # 4-bit block scales (LPBQ)
    nh.from_array((rng.random(N) * 1e-3 + 1e-4).astype(np.float32), "pc"),  # per-channel float scale
    nh.from_array(np.zeros(N, np.uint8), "pcz"),
]
nodes = [
    h.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xd"]),
    h.make_node("DequantizeLinear", ["bint", "pc", "pcz"], ["ws"], axis=1),
    h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0, block_size=B),
    h.make_node("MatMul", ["xd", "wd"], ["y"]),
    h.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
]
g = h.make_graph(
    nodes,
    "g",
    [h.make_tensor_value_info("x", T.UINT16, [1, 1, K])],
    [h.make_tensor_value_info("yq", T.UINT16, [1, 1, N])],
    init,
)
d = tempfile.mkdtemp()
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 21)]), f"{d}/m.onnx")
ort.register_execution_provider_library(onnxruntime_qnn.EP_NAME, onnxruntime_qnn.get_library_path())


def so(extra=None):
    s = ort.SessionOptions()
    s.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (extra or {}).items():
        s.add_session_config_entry(k, v)
    devs = [x for x in ort.get_ep_devices() if x.ep_name == onnxruntime_qnn.EP_NAME]
    s.add_provider_for_devices(
        devs, {"backend_type": "htp", "soc_model": "60", "htp_arch": "73", "offload_graph_io_quantization": "0"}
    )
    return s


os.chdir(d)
ort.InferenceSession(
    "m.onnx",
    sess_options=so(
        {"ep.context_enable": "1", "ep.context_file_path": f"{d}/m_ctx.onnx", "ep.context_embed_mode": "0"}
    ),
)
s = ort.InferenceSession(f"{d}/m_ctx.onnx", sess_options=so())
print(f"K={K} N={N} block={B} ({K // B} blocks): compiled and loaded; running", flush=True)
print("ran", s.run(None, {"x": np.full((1, 1, K), 32768, np.uint16)})[0].shape, flush=True)
