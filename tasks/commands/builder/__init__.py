"""The build command (``builder``): the doit process (:mod:`.startup`), the console reporter
(:mod:`.reporter`), thread mode refused (:mod:`.threads`), the stage, ``build:`` and ``explain:`` tasks
(:mod:`.cli`)."""
