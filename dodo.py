"""doit entry point: `doit` (the recipes and the commands), `doit build:<recipe>`, `doit explain:<recipe>`.
See README.md.

The one place the commands meet: it sets up the doit process (``tasks.commands.builder.startup``)
and collects each command's task creators, all sharing this doit command's Session (doit
imports dodo.py once per command): the recipe set it pins, the entries, key material and
up-to-date checks it works out once (tasks/core/session.py)."""

from tasks.commands.builder import cli as build, startup
from tasks.commands import cache
from tasks.commands.catalog import cli as catalog
from tasks.commands.cluster import cli as cluster
from tasks.commands.publish import cli as publish
from tasks.core.session import Session

SESSION = Session()
DOIT_CONFIG = startup.start(SESSION, globals())
globals().update(startup.creators(SESSION, globals()))
for _command in (build, cache, catalog, cluster, publish):
    globals().update(startup.with_invalid_recipes(SESSION, _command.creators(SESSION)))
