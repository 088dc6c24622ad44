"""Digests and the stat cache."""

from __future__ import annotations

import os

import xxhash

from tasks.digest import StatCache, canonical_json, digest_json, tree_digest


def test_stat_cache_reads_an_unchanged_file_once(tmp_path):
    f = tmp_path / "weights.bin"
    data = os.urandom(3 * (1 << 20) + 7)
    f.write_bytes(data)
    sc = StatCache(tmp_path / "sc.sqlite")
    d1 = sc.file_digest(f)
    assert d1 == xxhash.xxh3_128_hexdigest(data)
    assert sc.bytes_read == len(data)
    assert sc.file_digest(f) == d1 and sc.bytes_read == len(data) and sc.hits == 1
    # another process (another instance on the same database) gets the hit too
    other = StatCache(tmp_path / "sc.sqlite")
    assert other.file_digest(f) == d1 and other.bytes_read == 0
    # a changed file (same size, new mtime) is hashed again
    f.write_bytes(data[:-1] + b"\x00")
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert sc.file_digest(f) != d1 and sc.bytes_read == 2 * len(data)


def test_canonical_json_and_tree_digest(tmp_path):
    assert canonical_json({"b": 1, "a": [1, {"d": 2, "c": 3}]}) == '{"a":[1,{"c":3,"d":2}],"b":1}'
    assert digest_json({"a": 1, "b": 2}) == digest_json({"b": 2, "a": 1})
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "one.txt").write_text("1")
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "one.txt").write_text("1")
    assert tree_digest(tmp_path / "x") == tree_digest(tmp_path / "y")  # content, not location
    (tmp_path / "y" / "one.txt").rename(tmp_path / "y" / "two.txt")
    assert tree_digest(tmp_path / "x") != tree_digest(tmp_path / "y")  # names count


def test_stage_code_enters_the_key():
    """The source of the stage module, its CODE_DEPS and each step's patch module are in the
    key material, so editing a patch without bumping its version still makes builds stale."""
    from tasks.engine import code_digest
    from tasks.plan import StageSpec

    def spec(*names):
        return StageSpec("r", "patch", "patch", {"steps": [{"name": n, "version": 1, "params": {}} for n in names]})

    a, b = code_digest(spec("mask-range")), code_digest(spec("fold-constants"))
    assert a != b and len(a) == 32
    assert code_digest(spec("mask-range")) == a  # stable
    assert code_digest(StageSpec("r", "export", "export", {})) != code_digest(StageSpec("r", "compile", "compile", {}))
