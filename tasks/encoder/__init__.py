"""The encoder family (BERT-style sentence encoders, ``export.family: encoder``): its declaration
(``family.py``: stage table, DAG, what it cannot build of a model) and one module per stage kind,
each the contract of ``tasks/contract`` (``VERSION``, ``TOOLS``, ``run``, ...). Imports nothing of
``tasks/llm``."""
