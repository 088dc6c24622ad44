"""What kind of catalog row a recipe is, so the page can show real models by default
(:func:`listing`, :func:`alias_of`) and the runtimes a recipe serves (:func:`stated_runtimes`).

A row's ``listing`` (the first that applies):

=================  ==========================================================================
``unsupported``    a recipe of a model the LLM export does not implement (state unsupported)
``shape``          a shape build: random weights in the model's exact configuration
``fixture``        a tiny test model from ``.fixtures/`` (``scripts/tiny_llm.py``)
``alias``          builds the same stage keys as another recipe (``alias_of`` names it)
``model``          a real model: what the catalog page shows by default
=================  ==========================================================================

Aliases (:func:`alias_of`): two recipes whose plans agree stage by stage (stage name, kind,
implementation, params, upstream roles, the content of every data file) have the same
stage keys whatever the cache holds (:mod:`tasks.core.keys`: the key never holds the recipe
name), so they are one build under two names. Of each such group the name that ends in its
precision (the ``<model>-<precision>`` naming of ``recipes/``) is the one listed, else the
first by name; the others are its aliases.
"""

from __future__ import annotations

from tasks.store import digest
from tasks.core import recipeset
from tasks.core.keys import project_file
from tasks.core.session import Session

#: the listings, in the order the page's switch names them
LISTINGS = ("model", "shape", "fixture", "unsupported", "alias")

#: folder of the prebuilt tiny test models (``scripts/tiny_llm.py``), relative to the project root
FIXTURES = ".fixtures/"


def plan_fingerprint(session: Session, name: str) -> str:
    """xxh3-128 of what a recipe's stage keys are made of, less what is the same for every
    recipe of one checkout (code, tools) and less the upstream entries' digests (equal when the
    upstream fingerprints are): per stage its name, kind, implementation module, all its params
    (those the key leaves out too, such as verify thresholds and a local source's path, whose
    folder digest the key holds instead: equal params give equal keys, and two recipes with
    other bars are not one catalog entry), upstream roles and the content digest of each data
    file. Raises KeyError for a recipe not in the session's set, OSError
    (FileNotFoundError among them) for a data file that cannot be read."""
    out = []
    for spec in recipeset.plan(session, name).values():
        files = {role: digest.file_digest(project_file(rel)) for role, rel in spec.files.items()}
        out.append([spec.name, spec.kind, spec.impl.module, spec.params, spec.inputs, files])
    return digest.digest_json(out)


def alias_of(session: Session, rows: list[dict]) -> dict[str, str]:
    """{recipe: the recipe it is an alias of} among ``rows`` (catalog rows; unsupported ones
    have no plan and are never aliases): see the module docstring. A recipe whose plan cannot
    be fingerprinted (a data file gone since it loaded) is no one's alias."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["state"] == "unsupported":
            continue
        try:
            fp = plan_fingerprint(session, r["name"])
        except (KeyError, OSError):
            continue
        groups.setdefault(fp, []).append(r)
    out = {}
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda r: (not r["name"].endswith("-" + r["precision"]), r["name"]))
        for r in members[1:]:
            out[r["name"]] = members[0]["name"]
    return out


def listing(row: dict, aliases: dict[str, str]) -> str:
    """The row's listing (module docstring)."""
    src = row["source"]
    if row["state"] == "unsupported":
        return "unsupported"
    if row.get("shape_build"):
        return "shape"
    if src.get("kind") == "path" and str(src.get("path", "")).startswith(FIXTURES):
        return "fixture"
    if row["name"] in aliases:
        return "alias"
    return "model"


def stated_runtimes(recipe) -> list[str]:
    """The runtimes a recipe's bundle serves, as the recipe states them (known before a
    build): its family's ``runtimes`` hook (:class:`tasks.contract.model_family.Family`: an LLM
    bundle serves ``bundle.runtimes``); without one, onnxruntime's QNN EP (``onnxruntime-qnn``),
    which loads the EPContext model such a family ships."""
    from tasks.contract import family

    hook = family(recipe.export.family).runtimes
    return hook(recipe) if hook else ["onnxruntime-qnn"]
