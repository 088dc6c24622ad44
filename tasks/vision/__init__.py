"""The vision family (``export.family: vision``): image models that ship as finished ONNX graphs
(PP-OCR det, rec, cls). ``family.py`` holds what is family-wide (its recipe keys, its load
checks, its input sets); one module per stage kind (``export``, ``quantize``, ``compile``,
``verify``), each ending with ``STAGE``; ``inputs.py`` (rendered text, shipped photos, the
declared preprocessing) and ``decode.py`` (CTC, DB boxes, orientation; the task metrics) are its
library. Imports nothing of another family."""
