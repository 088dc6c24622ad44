"""The encoder family's declaration (``export.family: encoder``): BERT-style text encoders built
as one static graph. Its stages, the DAG a recipe of it expands into, and what it cannot build
of a model (:data:`FAMILY`, :class:`tasks.contract.model_family.Family`).

The DAG: download -> export -> [prepatch] -> quantize -> [patch] -> compile -> verify.
``prepatch`` holds the patch steps marked ``when: pre-quantize`` (rewrites that must precede
calibration); either patch stage is left out when it has no steps. A recipe with several targets
gets one compile and one verify stage per target, named ``compile@<target>`` and
``verify@<target>``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tasks.contract.model_family import Family


def plan(p) -> list:
    """The stage specs of an encoder recipe (module docstring), in build order; ``p`` a
    :class:`tasks.recipe.plan.Planner`."""
    r = p.recipe
    specs = [p.download(), p.spec("export", "export", p.params("export"), {"source": "download"})]
    model = "export"
    if pre := p.patch_steps("pre-quantize"):
        specs.append(p.patch("prepatch", pre, model))
        model = "prepatch"
    specs.append(
        p.spec(
            "quantize", "quantize", p.params("quantize"), {"model": model, "source": "download"}, p.files("quantize")
        )
    )
    model = "quantize"
    if post := p.patch_steps("post-quantize"):
        specs.append(p.patch("patch", post, model))
        model = "patch"
    for t, suffix in p.targets():
        specs.append(p.spec(f"compile{suffix}", "compile", {"target": t, **p.params("compile")}, {"model": model}))
        specs.append(
            p.spec(
                f"verify{suffix}",
                "verify",
                {**p.params("verify"), "target": t, "task": r.task},
                {"compiled": f"compile{suffix}", "qdq": model, "reference": "export", "source": "download"},
                p.files("verify"),
            )
        )
    return specs


def source_check(recipe, cfg: dict, config_file: Path) -> list[tuple[str, str]]:
    """What the encoder export cannot build of the model whose ``config.json`` is ``cfg``: an
    ``export.sequence_length`` above ``max_position_embeddings``, a tokenizer whose
    ``model_input_names`` lack an input the graph requires (:func:`tokenizer_problems`, the
    files beside ``config_file``)."""
    limit, problems = cfg.get("max_position_embeddings"), []
    if isinstance(limit, int) and recipe.export.sequence_length > limit:
        problems.append(
            (
                "export.sequence_length",
                f"expected at most the model's max_position_embeddings "
                f"({limit}), found {recipe.export.sequence_length}",
            )
        )
    return problems + tokenizer_problems(config_file.parent)


def tokenizer_problems(folder: Path) -> list[tuple[str, str]]:
    """What the source's tokenizer files say against the exported encoder graph's inputs:
    ``tokenizer_config.json``'s ``model_input_names`` (when it has one) must hold every input of
    :data:`tasks.encoder.inputs.REQUIRED_INPUTS`; the ones in ``ZERO_WHEN_ABSENT``
    (``token_type_ids``) may be missing, they are fed as zeros. [(key path, message)]."""
    from tasks.store import plancache

    f = folder / "tokenizer_config.json"
    plancache.note(f)
    try:
        names = json.loads(f.read_text(encoding="utf-8")).get("model_input_names") if f.is_file() else None
    except (OSError, ValueError, AttributeError) as e:
        return [("source", f"expected a readable JSON tokenizer_config.json, found {f} ({e})")]
    if names is None:
        return []
    from tasks.encoder.inputs import REQUIRED_INPUTS, ZERO_WHEN_ABSENT

    missing = [n for n in REQUIRED_INPUTS if not isinstance(names, list) or n not in names]
    if not missing:
        return []
    return [
        (
            "source",
            f"expected a tokenizer whose model_input_names include {', '.join(REQUIRED_INPUTS)} (inputs "
            f"every exported encoder graph requires; {', '.join(ZERO_WHEN_ABSENT)} may be absent: fed as "
            f"zeros), found model_input_names {json.dumps(names)} in {f}",
        )
    ]


#: the bars an encoder recipe that sets no ``verify.thresholds`` is judged by: the loosest an
#: encoder recipe here ships with (``recipes/minilm-l6-w4a16.yaml``: all-MiniLM-L6-v2 at 4-bit
#: weights measured 0.9942 / 0.9884 on the HTP simulator, README "Recipes"; its w8a16 build sets
#: 0.995 / 0.99). Names: ``tasks/encoder/verify.py`` ``THRESHOLDS``.
DEFAULT_THRESHOLDS = {"pooled_cosine_mean": 0.99, "pooled_cosine_min": 0.97}


def default_thresholds(recipe) -> dict[str, float]:
    """:data:`DEFAULT_THRESHOLDS` when ``recipe`` sets no ``verify.thresholds`` (absent, or null
    through ``extends``), else {} (its own bars are the whole set); {} for a shape build, whose
    figures are never judged (``tasks/sources/shape.py``)."""
    if recipe.source.shape or "thresholds" in recipe.verify.model_fields_set:
        return {}
    return dict(DEFAULT_THRESHOLDS)


FAMILY = Family(
    name="encoder",
    title="an encoder",
    stages={
        "download": "tasks.sources.download",
        "export": "tasks.encoder.export",
        "patch": "tasks.patches.stage",
        "quantize": "tasks.encoder.quantize",
        "compile": "tasks.encoder.compile",
        "verify": "tasks.encoder.verify",
    },
    plan=plan,
    source_check=source_check,
    default_thresholds=default_thresholds,
    catalog_chart=("Encoders: quality versus size", "encoder", "pooled_cosine_mean", "mean-pooled cosine vs fp32"),
)
