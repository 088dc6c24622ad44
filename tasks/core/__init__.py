"""The build core: stage keys, the recipe set, resolving stages to cache entries, running a
stage, and a recipe's build state. Nothing here knows doit; every function takes the
command's :class:`tasks.core.session.Session`, which holds all that is remembered between
calls (this package keeps no state of its own).

- ``keys``: key material, the import-graph code digest, ``stage_key``;
- ``recipeset``: the recipes folder as a command sees it (plan cache, pinning);
- ``resolve``: the local/remote cache, and keys and entries of one recipe's stages;
- ``run``: building one stage (``build_spec``, ``run_stage``) and its console line;
- ``record``: ``build/<recipe>/stages.json``, what a recipe's last build recorded;
- ``state``: the typed build state of a recipe and its artifacts;
- ``explain``: ``doit explain:<recipe>``.
"""
