"""What a remote cache and a build folder hold, read back for comparison (remote builds in core/
and cluster builds in commands/)."""

from __future__ import annotations

import json
import os

import fsspec

from conftest import Project


def remote_fs(url):
    opts = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]} if url.startswith("s3://") else {}
    fs, root = fsspec.core.url_to_fs(url, **opts)
    fs.invalidate_cache()
    return fs, root.rstrip("/")


def remote_manifests(url) -> dict[str, bytes]:
    """{"kind/key": manifest.json bytes} of every visible remote entry."""
    from tasks.contract import kinds

    fs, root = remote_fs(url)
    out = {}
    for kind in kinds():
        if not fs.exists(f"{root}/{kind}"):
            continue
        for d in fs.ls(f"{root}/{kind}", detail=False):
            key = d.rstrip("/").rsplit("/", 1)[1]
            try:
                out[f"{kind}/{key}"] = fs.cat_file(f"{root}/{kind}/{key}/manifest.json")
            except FileNotFoundError:
                pass
    return out


def build_files(project: Project, recipe: str) -> dict[str, bytes]:
    root = project.root / "build" / recipe
    listed = json.loads((root / "artifacts.json").read_text())
    return {rel: (root / rel).read_bytes() for rel in [*listed, "artifacts.json"]}
