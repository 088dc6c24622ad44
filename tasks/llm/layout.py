"""LLM graph layout constants shared by the export that writes the graphs and the stages that
read them (quantize keeps the RoPE tables at 16 bits, the genai config checks the I/O layout),
so those stages' keys do not hold the exporter's code."""

# what ``export.json`` calls the graph I/O contract (tasks/llm/export.py's module docstring)
IO_LAYOUT = ("genai-pipeline-static: int32 input_ids, past_seq_len [1,1], total_seq_len [1]; "
             "KV [1,Hkv,C,d] shared past/present buffer")
ROPE_TABLES = ("rope_cos", "rope_sin")
