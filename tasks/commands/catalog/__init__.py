"""The catalog command: the files it writes (:mod:`.write`), the page (:mod:`.page`), the
table both show (:mod:`.table`), its doit task (:mod:`.cli`)."""
