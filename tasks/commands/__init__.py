"""The commands, side by side: ``builder`` (the stage tasks, ``build:``, ``explain:`` and
the doit process), ``cache`` (``gc``, ``cache_verify``, ``push``), ``catalog``, ``cluster`` and
``publish`` (``publish:``, ``reproduce:``, ``check_bundle``). Each exposes ``creators(session)``,
its doit task creators; ``dodo.py`` collects them. No command imports another: what two share
is in :mod:`tasks.core` (a recipe's state and catalog row, ``build/<recipe>/``, the errors
that explain themselves)."""
