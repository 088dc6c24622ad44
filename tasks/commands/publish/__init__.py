"""The publish command: a verified build shipped as a bundle, and the bundle checked.

``doit publish:<recipe>`` (:mod:`.write`) refuses a recipe that is not ``verified`` or
``built-no-bars`` (see :mod:`tasks.core.status`: verify failed, stale build, never built), saying
why; it never builds. A recipe without bars is published as "built (no bars)", never "verified".
Otherwise it writes, from the cache entries of the recipe's current stage keys:

- ``dist/<recipe>/`` (:func:`tasks.store.paths.dist_dir`): of the build's artifacts, what the
  bundle's runtimes load (:func:`.contents.shipped_files`, the rule: the models and binaries
  ``genai_config.json`` / ``genie_config.json`` name, an encoder's ``*_ctx.onnx`` and its binary;
  in a ``<target>/`` sub-folder each when the recipe has several targets; not the per-graph
  binaries an LLM's verify runs beside weight-shared ones), the export's tokenizer and config
  files, ``README.md`` (a model card made with ``huggingface_hub.ModelCard``: state, license,
  source, how to run it with a snippet per runtime, every graph's inputs and outputs, the
  runtime versions, verify metrics, device figures, every file and what loads it, how to check
  the files and the signature; :mod:`.card`, :mod:`.usage`) and ``manifest.json`` (:mod:`.bundle`);
- ``dist/<recipe>-<short key>.tar.gz``, ``short key`` = the first 12 hex of the xxh3 of every
  stage's key (:func:`.bundle.short_key`), deterministic (:mod:`.archive`).

Two builds from *empty* caches agree on every file, the context binaries included
(tasks/qnn/ep.py ``compile_settled``: a compile that comes out as the QNN SDK's racy padding
variant is compiled again); no file or region is excused (tests/test_catalog_publish.py).

Shipped bytes are checked: every cache file that goes into the bundle is read in full and
checked against its cache entry's manifest before it is listed
(:func:`.bundle.shipped_digests`); a damaged entry is quarantined and publish refuses, naming
the file and the entry. ``--sign KEY`` signs the folder with OpenSSF model-signing
(:mod:`.signing`); ``--hub-repo`` publishes to the Hugging Face Hub (:mod:`.hub`).

Also ``doit check_bundle`` (:mod:`.check`: a bundle folder or its archive) and ``doit
reproduce:<recipe>`` (:mod:`.reproduce`). All three count a bundle's files alike
(:func:`.check.file_count`: manifest.json and the files it lists).
The doit tasks: :mod:`.cli`.
"""
