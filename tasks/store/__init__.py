"""Storage: the stage cache (``entries``), its locks and file operations (``keylock``,
``fileops``), content digests (``digest``), the remote second level (``remote``), the plan cache
(``plancache``), a stage's log (``stagelog``), where things live (``paths``) and writing outside
the cache (``outputs``). It knows no stage, family or QNN."""
