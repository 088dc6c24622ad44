"""Qualcomm's Genie runtime: its graph layout (``graphs``), their QDQ and context binaries
(``quantize``, ``compile``: stage implementations), the graph names in the binaries
(``names``, ``binaries``), its config files (``config``), the host loop that feeds the graphs as
Genie does (``host_loop``); ``libGenie.so`` itself is loaded by :mod:`tasks.qnn.libgenie`."""
