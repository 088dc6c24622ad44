"""The audio family (``export.family: audio``): sound models that ship as finished ONNX graphs
and run on a stream of frames with a recurrent state (Silero VAD). ``family.py`` holds what is
family-wide (its recipe keys, its load checks, its input sets); one module per stage kind
(``export``, ``quantize``, ``compile``, ``verify``), each ending with ``STAGE``; ``speech.py``
(espeak-ng speech between silence and noise) and ``frames.py`` (the stream's calls, speech
spans) are its library. Imports nothing of another family."""
