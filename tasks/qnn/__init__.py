"""The QNN domain: onnxruntime + the onnxruntime-qnn EP (``ep``), context binaries read back and
checked (``context_binary``, ``context_binary_checks``), the quantizer's settings and the weight
encodings it does not write (``quantconfig``, ``weights``, ``gather_tables``, ``gptq``,
``seqgptq``), the precision and target tables (``precisions``, ``targets``) and ONNX graphs in
stage folders (``graphs``); and for graphs that ship as finished ONNX files, the rewrites that
make one static and quantizable (``prepare``), its quantization on feeds given as arrays
(``quantize_arrays``) and running graphs over arrays on the CPU and HTP (``run_arrays``); and
Qualcomm's Genie runtime library, ``libGenie.so`` of onnxruntime-qnn, through ctypes
(``libgenie``). It knows no recipe, stage or family."""
