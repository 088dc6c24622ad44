"""LLM layout constants shared by the stage that writes a file or graph and the stages that read
it (quantize keeps the RoPE tables at 16 bits, the genai config checks the I/O layout, quantize
reads the ranges calibrate wrote), so those stages' keys do not hold the writer's code."""

# what ``export.json`` calls the graph I/O contract (tasks/llm/export.py's module docstring)
IO_LAYOUT = (
    "genai-pipeline-static: int32 input_ids, past_seq_len [1,1], total_seq_len [1]; "
    "KV [1,Hkv,C,d] shared past/present buffer"
)
ROPE_TABLES = ("rope_cos", "rope_sin")
#: the folder of a calibrate entry holding the MinMax ranges of the part's graphs over the
#: recorded calls ({prefill,decode}.json), which the quantize stage reads
RANGES = "ranges"
