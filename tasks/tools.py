"""Versions of the tools a stage uses; they enter its stage key and its manifest.

A context binary built with one QNN SDK can behave differently from one built with another
(microsoft/onnxruntime-qnn issue 858), so the SDK version inside the onnxruntime-qnn wheel
(``onnxruntime_qnn.build_and_package_info.qnn_version``) is a tool of its own: ``qnn-sdk``.
"""

from __future__ import annotations

import platform
import sys
from functools import cache
from importlib import metadata


@cache
def version(name: str) -> str:
    """Version string of tool ``name``: a distribution name (``onnxruntime``, ``torch``...),
    ``qnn-sdk`` or ``python``. Returns ``"absent"`` for an uninstalled distribution."""
    if name == "qnn-sdk":
        try:
            from onnxruntime_qnn import build_and_package_info as info

            return str(info.qnn_version)
        except ImportError:
            return "absent"
    if name == "python":
        return ".".join(map(str, sys.version_info[:3]))
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def versions(names) -> dict[str, str]:
    """{name: version} for ``names``, sorted by name."""
    return {n: version(n) for n in sorted(set(names))}


def host() -> dict[str, str]:
    """The build host, for manifests (not for keys): OS, machine, Python."""
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "python": version("python"),
        "platform": platform.platform(),
    }


def builder() -> dict:
    """Which process built an entry, for manifests (not for keys): node name, pid and, when
    set, ``NPUBUILD_BUILDER`` (e.g. a cluster worker's name)."""
    import os

    out = {"node": platform.node(), "pid": os.getpid()}
    if os.environ.get("NPUBUILD_BUILDER"):
        out["name"] = os.environ["NPUBUILD_BUILDER"]
    return out
