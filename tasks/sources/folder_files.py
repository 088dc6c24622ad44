"""What a model folder holds, by file name: the weight files and the tokenizer file sets that
the download's completeness check (:func:`tasks.sources.hub_files.format_missing`) and a shape
build's tokenizer folder (:func:`tasks.sources.shape.tokenizer_problem`) accept. A leaf module:
both read it, neither imports the other for it."""

#: weights a model folder may hold in one file, each with the index file that names its shards
WEIGHTS = (("model.safetensors", "model.safetensors.index.json"), ("pytorch_model.bin", "pytorch_model.bin.index.json"))
#: the file sets a tokenizer may be saved as (fast tokenizer, SentencePiece, WordPiece, BPE)
TOKENIZERS = (
    ("tokenizer.json",),
    ("tokenizer.model",),
    ("spiece.model",),
    ("sentencepiece.bpe.model",),
    ("vocab.txt",),
    ("vocab.json", "merges.txt"),
)
#: what :data:`TOKENIZERS` asks of a folder, as messages say it
TOKENIZER_WANTED = "tokenizer.json (or tokenizer.model, vocab.txt, or vocab.json and merges.txt)"
