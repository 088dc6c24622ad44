"""The cluster command: stale stages built on a Dask cluster (:mod:`.build`), its doit task
(:mod:`.cli`)."""
