"""Before the first stage of a recipe is built in a command: refuse the build when one of the
stages still to build cannot fit the memory budget even in a process of its own (its estimate
alone exceeds it), so a build that cannot finish stops before any work instead of after an
hour of stages (:func:`refuse_what_cannot_fit`). Each stage is checked again before its own
work, then with what the doit process holds (:func:`tasks.core.run.build_spec`)."""

from __future__ import annotations


def refuse_what_cannot_fit(recipe_name: str, specs: dict, estimate, keys, built) -> None:
    """For each stage of ``recipe_name``'s plan (``specs``: {stage: StageSpec}, in order) not
    ``built(stage)`` (an intact cache entry: a cache hit needs no memory), its estimate
    (``estimate(stage) -> bytes``: the whole process tree's peak in a fresh process; a stage
    whose estimate raises is left to its own check) against the budget
    (:func:`tasks.proc.budget.check`, nothing held). Raises
    :class:`tasks.proc.budget.NotEnoughMemory` for the first that does not fit: one line naming
    the recipe, the stage, the figures and the recipe keys that lower it (``keys(stage) -> str
    | None``; None: more memory). Nothing is checked without a known budget or memory available."""
    from tasks.proc.budget import NotEnoughMemory, available_bytes, check

    avail = available_bytes()
    if avail is None:
        return
    for name, spec in specs.items():
        try:
            est = estimate(name)
        except Exception:  # e.g. an LLM whose config.json is not at hand: its own check runs later
            continue
        if est <= avail or built(name):
            continue
        try:
            check(spec.kind, est, spec.part, recipe_keys=keys(name), log=False)
        except NotEnoughMemory as e:
            raise NotEnoughMemory(f"build:{recipe_name} refused before any stage ran: {e}") from None


def admit(session, recipe_name: str, res, estimate) -> None:
    """Once per recipe and command (``session.admitted``): refuse the build when a stage still
    to build cannot fit the memory budget alone (:func:`refuse_what_cannot_fit`, with
    ``estimate(session, recipe_name, stage)`` (:func:`tasks.core.run.memory_estimate`) and the
    family's ``memory_keys`` hook; ``res``: the recipe's
    :class:`tasks.core.resolve.Resolver`)."""
    from tasks.contract import family

    if recipe_name in session.admitted:
        return
    session.admitted.add(recipe_name)

    def keys(stage):
        hook = family(res.specs[stage].family).memory_keys
        return hook(res.specs, stage) if hook else None

    def built(stage):
        try:
            return res.entry(stage) is not None
        except Exception:  # its key cannot be computed yet (an upstream not built): to build
            return False

    refuse_what_cannot_fit(recipe_name, res.specs, lambda s: estimate(session, recipe_name, s), keys, built)


def estimate_or_none(session, recipe_name: str, stage: str, estimate) -> int | None:
    """``estimate(session, recipe_name, stage)`` (:func:`tasks.core.run.memory_estimate`), or
    None when it cannot be made before the stage runs (an LLM's config.json not at hand: the
    stage's own check, after its inputs are read, still runs)."""
    try:
        return estimate(session, recipe_name, stage)
    except Exception:
        return None
