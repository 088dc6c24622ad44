"""The licence an installed package declares for what it ships, read from its distribution's
metadata and licence files (``importlib.metadata``; the package is found, never imported).

A wheel says its licence in up to three places, and they need not agree: the ``License-Expression``
field (an SPDX expression, PEP 639), the older free-text ``License`` field, the ``License ::``
trove classifiers; and the licence files it ships (``License-File`` entries, or files named
``LICENSE``/``COPYING``/``NOTICE`` in its ``.dist-info``). :func:`package_licence` reads them
all: ``declared`` is what the metadata says (expression, else the ``License`` field when it is
a short SPDX-like name, else the classifiers), ``files`` what each licence file's text is
(recognised by its opening words), and ``summary`` one line that shows both when they
disagree (the card and the catalog print it). Nothing here is a legal judgement: it reports
what the package says of itself.
"""

from __future__ import annotations

import re
from importlib import metadata

#: trove classifier (after ``License :: ``) -> SPDX id
CLASSIFIERS = {
    "OSI Approved :: MIT License": "MIT",
    "OSI Approved :: Apache Software License": "Apache-2.0",
    "OSI Approved :: BSD License": "BSD",
    "OSI Approved :: ISC License (ISCL)": "ISC",
    "OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "OSI Approved :: GNU General Public License v3 (GPLv3)": "GPL-3.0",
    "OSI Approved :: GNU Lesser General Public License v3 (LGPLv3)": "LGPL-3.0",
    "OSI Approved :: Python Software Foundation License": "PSF-2.0",
}
#: (regex on a licence file's text, SPDX id): the opening words of each licence; the one that
#: starts earliest in a file names it (a file may append the licences of what it bundles)
TEXTS = (
    (r"Apache License\s+Version 2\.0", "Apache-2.0"),
    (r"Permission is hereby granted, free of charge", "MIT"),
    (r"Redistribution and use in source and binary forms.*?Neither the name", "BSD-3-Clause"),
    (r"Redistribution and use in source and binary forms", "BSD-2-Clause"),
    (r"GNU GENERAL PUBLIC LICENSE\s+Version 3", "GPL-3.0"),
    (r"GNU LESSER GENERAL PUBLIC LICENSE", "LGPL"),
    (r"Mozilla Public License,? [Vv]ersion 2\.0", "MPL-2.0"),
    (r"Permission to use, copy, modify, and/or distribute", "ISC"),
    (r"Permission to use, copy, modify,? and distribute this software and its associated documentation", "MIT-CMU"),
)
_LICENCE_NAMES = re.compile(r"^(LICEN[CS]E|COPYING)", re.I)  # a NOTICE file is attribution, not a licence


def distribution_of(package: str) -> str | None:
    """The installed distribution that provides import package ``package`` (``silero_vad`` ->
    ``silero-vad``), from ``importlib.metadata.packages_distributions``; None when none does."""
    dists = metadata.packages_distributions().get(package) or []
    return sorted(dists)[0] if dists else None


def _spdx_like(text: str) -> bool:
    """A ``License`` field that names a licence (``Apache-2.0``, ``MIT``), not a licence's whole text."""
    return len(text) <= 64 and "\n" not in text.strip()


def text_licence(text: str) -> str:
    """The SPDX id of a licence file's text: the licence of :data:`TEXTS` whose opening words
    come first in it, else ``unrecognised``."""
    flat = " ".join(text.split())
    found = [(m.start(), i, spdx) for i, (pattern, spdx) in enumerate(TEXTS) if (m := re.search(pattern, flat, re.S))]
    return min(found)[2] if found else "unrecognised"


def _norm(spdx: str) -> str:
    return spdx.lower().replace("-clause", "").replace(" ", "")


def package_licence(package: str) -> dict:
    """What installed import package ``package`` says of its licence: {"distribution", "version",
    "declared" (str or None), "declared_from" (``License-Expression`` | ``License`` |
    ``classifiers`` | None), "files" {file: SPDX id or ``unrecognised``}, "agree" (bool: every
    file's licence is the declared one; true without files), "summary" (one line)}. Raises
    SourceError when no installed distribution provides ``package``."""
    from tasks.sources import SourceError

    dist_name = distribution_of(package)
    if dist_name is None:
        raise SourceError(f"source package {package!r}: no installed distribution provides it (pip install it)")
    dist = metadata.distribution(dist_name)
    meta = dist.metadata
    declared, where = None, None
    if meta.get("License-Expression"):
        declared, where = meta["License-Expression"].strip(), "License-Expression"
    elif meta.get("License") and meta["License"].strip() not in ("", "UNKNOWN") and _spdx_like(meta["License"]):
        declared, where = meta["License"].strip(), "License"
    else:
        found = [
            CLASSIFIERS.get(c.removeprefix("License :: "), c.removeprefix("License :: "))
            for c in meta.get_all("Classifier") or []
            if c.startswith("License ::")
        ]
        if found:
            declared, where = " AND ".join(dict.fromkeys(found)), "classifiers"
        elif meta.get("License"):  # a whole licence text in the field (scikit-image's Debian-style copyright file)
            declared, where = text_licence(meta["License"]), "License"
    files = {}
    for f in dist.files or []:
        name = f.name
        in_info = f.parts[0].endswith(".dist-info") and len(f.parts) <= 3  # its own, not bundled third parties'''
        if in_info and _LICENCE_NAMES.match(name):
            loc = f.locate()
            text = loc.read_text(encoding="utf-8", errors="replace") if loc.is_file() else ""
            files[f.as_posix()] = text_licence(text) if text else "unreadable"
    agree = all(
        declared is not None and (_norm(v).startswith(_norm(declared)) or _norm(declared).startswith(_norm(v)))
        for v in files.values()
    )  # "BSD" (a classifier) agrees with a BSD-3-Clause text
    if declared is None:
        summary = (
            ("none declared; " + ", ".join(f"{k}: {v}" for k, v in sorted(files.items())))
            if files
            else "none declared, no licence file"
        )
    elif not files:
        summary = f"{declared} (package metadata, {where}; no licence file in the wheel)"
    elif agree:
        summary = f"{declared} (package metadata and licence file)"
    else:
        summary = f"{declared} (package metadata, {where}) but licence file " + ", ".join(
            f"{k}: {v}" for k, v in sorted(files.items())
        )
    return {
        "distribution": dist_name,
        "version": dist.version,
        "declared": declared,
        "declared_from": where,
        "files": files,
        "agree": agree,
        "summary": summary,
    }
