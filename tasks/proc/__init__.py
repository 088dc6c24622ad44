"""Process plumbing, shared by the engine and both model families and knowing neither: child
processes (``child``), the allocator while small stages run (``heap``), Ctrl-C and SIGTERM
(``interrupt``), lazy imports (``lazy``), token scrubbing in messages (``scrubbing``) and
whether a process id is still alive (``processes``)."""
