"""doit entry point: `doit list`, `doit build:<recipe>`, `doit explain:<recipe>`. See README.md."""

from tasks.dodo_tasks import *  # noqa: F401,F403  (task creators and DOIT_CONFIG)
