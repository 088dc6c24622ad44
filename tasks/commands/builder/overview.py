"""What a plain ``doit`` and ``doit list`` print (:func:`print_overview`): the recipes with their
state in the local cache, then the commands, one line each, then the stage tasks as one line.
Nothing is built, downloaded or moved: the states are the catalog's (:mod:`tasks.core.status`),
read from the local cache alone, and the recipes come from the plan cache when it matches (no
recipe file is parsed: a ``doit list`` stays as fast as before)."""

from __future__ import annotations

import re
import shutil
import textwrap

from tasks.core import recipeset
from tasks.core.session import Session


def recipe_lines(session: Session) -> list[tuple[str, str, str, str]]:
    """(name, state, family, precision) of every recipe, sorted by name: the valid
    non-abstract ones with their state (:func:`tasks.core.status.recipe_status`), then the
    invalid files (state ``invalid``: its ``build:<stem>`` says why) and the unsupported models
    (``unsupported``)."""
    from tasks.core.status import recipe_status
    from tasks.errors import UnsupportedModel

    out = []
    for name in recipeset.buildable(session):
        specs = recipeset.plan(session, name).values()
        family = next((s.family for s in specs), "")
        precision = next((s.params.get("precision") for s in specs if s.kind == "quantize"), "") or ""
        out.append((name, recipe_status(name, session).state, family, precision))
    for stem, e in recipeset.recipe_errors(session).items():
        out.append((stem, "unsupported" if isinstance(e, UnsupportedModel) else "invalid", "", ""))
    return sorted(out)


def first_paragraph(doc: str | None) -> str:
    """A creator's docstring as the one paragraph a command list shows: its first paragraph,
    whitespace collapsed."""
    return re.sub(r"\s+", " ", (doc or "").strip().split("\n\n")[0]).strip()


def print_overview(session: Session, commands: dict[str, str], stage_groups: list[str], header: str = "") -> None:
    """Print ``header`` (if any), the recipes (:func:`recipe_lines`), the ``commands``
    ({group: what it does}, sorted) wrapped to the terminal, and the ``stage_groups`` as one
    line (``doit list --all`` lists their tasks)."""
    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    if header:
        print(header)
    rows = recipe_lines(session)
    print(
        f"Recipes ({len(rows)}; their state in the local cache; `doit catalog` writes the full table and a page "
        "to pick from):"
    )
    if rows:
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        for name, state, family, precision in rows:
            print(f"  {name:<{w[0]}}  {state:<{w[1]}}  {family:<{w[2]}}  {precision}".rstrip())
    else:
        print("  none: add recipes/<name>.yaml (recipes/README.md)")
    print("Commands (doit <command>; those with :<recipe> take one):")
    w = max(len(c) for c in commands) + 2 if commands else 0
    for cmd, what in sorted(commands.items()):
        lines = textwrap.wrap(what, width=max(30, width - w - 2)) or [""]
        print(f"  {cmd:<{w}}{lines[0]}")
        for more in lines[1:]:
            print(f"  {'':<{w}}{more}")
    if stage_groups:
        stages = textwrap.wrap(
            f"{', '.join(stage_groups)}: one task per stage of every recipe, run by build:<recipe> "
            "(doit list --all lists them)",
            width=width - 4,
        )
        print("Stage tasks (<stage>:<recipe>):")
        for line in stages:
            print(f"  {line}")
