"""Facts of the encoder graphs npubuild exports (optimum's text encoder ONNX configs), shared by
recipe checks at load and the encoder quantize and verify, so the recipe loader needs no stage code."""

# Encoder graph inputs a tokenizer may not give, which the model reads as all zeros when they
# are absent: fed as zeros then. token_type_ids: transformers' BERT-family models default it
# to zeros (``BertModel.forward``: "token_type_ids ... defaults to zeros"), which is what e5-
# style tokenizers (model_input_names without it) rely on.
ZERO_WHEN_ABSENT = ("token_type_ids",)
# Inputs every exported encoder graph declares (optimum's text encoder ONNX configs) and no
# default can stand in for: refused at recipe load when the tokenizer does not give them
# (``tasks.encoder.export.tokenizer_problems``).
REQUIRED_INPUTS = ("input_ids", "attention_mask")
