"""Facts of the encoder graphs npubuild exports (optimum's text encoder ONNX configs), shared by
recipe checks at load and the encoder quantize and verify, so the recipe loader needs no stage code;
and the feeds both stages give those graphs (:func:`encoder_feeds`, its imports inside it, so the
recipe loader imports nothing heavy through this module)."""

from __future__ import annotations

from pathlib import Path

from tasks.errors import InputError

# Encoder graph inputs a tokenizer may not give, which the model reads as all zeros when they
# are absent: fed as zeros then. token_type_ids: transformers' BERT-family models default it
# to zeros (``BertModel.forward``: "token_type_ids ... defaults to zeros"), which is what e5-
# style tokenizers (model_input_names without it) rely on.
ZERO_WHEN_ABSENT = ("token_type_ids",)
# Inputs every exported encoder graph declares (optimum's text encoder ONNX configs) and no
# default can stand in for: refused at recipe load when the tokenizer does not give them
# (``tasks.encoder.family.tokenizer_problems``).
REQUIRED_INPUTS = ("input_ids", "attention_mask")


def encoder_feeds(model_path: Path, tokenizer_dir: Path, texts: list[str], max_length: int) -> list[dict]:
    """Tokenized feeds for an encoder graph: one dict per text holding exactly the graph's
    inputs, {input name: array [1, L]}, each in the graph's dtype (int32 after export). An
    input of :data:`ZERO_WHEN_ABSENT` the tokenizer does not give is fed as zeros. Raises
    ValueError naming the graph, the input and what the tokenizer gives when the graph wants
    any other input the tokenizer does not give."""
    import numpy as np
    import onnx
    from transformers import AutoTokenizer

    from tasks.qnn.graphs import load_model

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    m = load_model(model_path, load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    want = {
        i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        for i in m.graph.input
        if i.name not in init
    }
    feeds = []
    for t in texts:
        enc = tok(t, padding="max_length", truncation=True, max_length=max_length, return_tensors="np")
        missing = [n for n in want if n not in enc and n not in ZERO_WHEN_ABSENT]
        if missing:
            raise InputError(
                f"{model_path}: graph inputs {missing}: expected the tokenizer in {tokenizer_dir} to "
                f"give them, found only {sorted(enc)} (inputs fed as zeros when absent: "
                f"{', '.join(ZERO_WHEN_ABSENT)})"
            )
        shape = np.asarray(enc["input_ids"]).shape
        feeds.append(
            {name: (np.asarray(enc[name]) if name in enc else np.zeros(shape)).astype(dt) for name, dt in want.items()}
        )
    return feeds
