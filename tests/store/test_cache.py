"""The cache on its own: atomic commit, copies without timestamps, malformed manifests, NaN
verify results, relative locations."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from tasks.store import paths
from tasks.store.entries import Cache
from tasks.encoder import verify


def _build(out):
    (out / "a.bin").write_bytes(b"\x01" * 1000)
    (out / "sub").mkdir()
    (out / "sub" / "b.txt").write_text("hello")
    return {"n": 2}


def test_entry_copied_without_timestamps_stays_valid(tmp_path):
    c = Cache(tmp_path / "c1")
    e, built = c.get_or_build("export", "k" * 32, {"x": 1}, _build)
    assert built and e.manifest["info"] == {"n": 2} and set(e.manifest["outputs"]) == {"a.bin", "sub/b.txt"}
    assert c.get_or_build("export", "k" * 32, {}, _build)[1] is False  # a cache hit
    shutil.copytree(tmp_path / "c1", tmp_path / "c2", copy_function=shutil.copyfile)  # new mtimes
    c2 = Cache(tmp_path / "c2")
    assert c2.lookup("export", "k" * 32) is not None  # same content: valid, not "damaged"
    p = c2.entry_path("export", "k" * 32) / "out" / "sub" / "b.txt"
    p.chmod(0o644)
    p.write_text("HELLO")
    assert c2.lookup("export", "k" * 32) is None  # content changed: quarantined
    assert len(list((tmp_path / "c2" / ".damaged").iterdir())) == 1


@pytest.mark.parametrize("manifest", ["[1, 2]", '{"key": "K", "outputs": {"a.bin": {"xxh3": "0"}}}', "{not json"])
def test_malformed_manifest_is_damage_not_a_crash(tmp_path, manifest):
    c = Cache(tmp_path)
    e, _ = c.get_or_build("patch", "m" * 32, {}, _build)
    (e.path / "manifest.json").write_text(manifest.replace("K", "m" * 32))
    assert c.problems("patch", "m" * 32)[0].startswith("manifest.json unreadable or malformed")
    assert c.lookup("patch", "m" * 32) is None
    assert c.get_or_build("patch", "m" * 32, {}, _build)[1] is True  # rebuilt


def test_failed_build_commits_nothing(tmp_path):
    c = Cache(tmp_path)

    def half(out):
        (out / "partial.onnx").write_bytes(b"x" * 10)
        raise RuntimeError("killed halfway")

    with pytest.raises(RuntimeError):
        c.get_or_build("quantize", "q" * 32, {}, half)
    assert c.problems("quantize", "q" * 32) is None and list((tmp_path / ".tmp").iterdir()) == []


def test_nan_never_passes_verify(tmp_path):
    (tmp_path / "verify.json").write_text(
        json.dumps({"metrics": {"pooled_cosine_mean": float("nan"), "max_abs_error": float("nan")}, "samples": []})
    )
    fails = verify.STAGE.check(tmp_path, {}, {"thresholds": {"pooled_cosine_mean": 0.99, "max_abs_error": 1.0}})
    assert len(fails) == 2 and all("not a number" in f for f in fails)
    import numpy as np

    assert math.isnan(verify.cosine(np.array([1.0, np.nan]), np.array([1.0, 2.0])))


def test_relative_locations_are_refused(monkeypatch):
    monkeypatch.setenv("NPUBUILD_CACHE", "relcache")
    with pytest.raises(ValueError, match="NPUBUILD_CACHE='relcache': expected an absolute path"):
        paths.cache_dir()
