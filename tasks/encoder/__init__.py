"""The encoder family (BERT-style sentence encoders, ``export.family: encoder``): one module per
stage kind, each the contract of ``tasks/contract`` (``VERSION``, ``TOOLS``, ``run``, ...).
Imports nothing of ``tasks/llm``."""
