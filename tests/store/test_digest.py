"""Digests and the stat cache."""

from __future__ import annotations

import os
import subprocess
import time

import xxhash

from tasks.store.digest import RACY_NS, StatCache, canonical_json, digest_json, tree_digest


def test_stat_cache_reads_an_unchanged_file_once(tmp_path):
    f = tmp_path / "weights.bin"
    data = os.urandom(3 * (1 << 20) + 7)
    f.write_bytes(data)
    time.sleep(RACY_NS / 1e9 + 0.1)  # a file this fresh is hashed every time (racily clean)
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


def test_stat_cache_asks_its_database_once_per_file_and_process(tmp_path):
    """A file asked for again with the same stat (a module: for its imports, then for the code
    digest) is answered from memory: no query. Edited, it is hashed again (the tests above)."""
    f = tmp_path / "module.py"
    f.write_text("import os\n")
    time.sleep(RACY_NS / 1e9 + 0.1)
    sc = StatCache(tmp_path / "sc.sqlite")
    d = sc.file_digest(f)
    queries = []
    sc._conn().set_trace_callback(queries.append)
    assert [sc.file_digest(f) for _ in range(3)] == [d] * 3 and sc.hits == 3 and queries == []
    f.write_text("import sys\n")
    assert sc.file_digest(f) == xxhash.xxh3_128_hexdigest(b"import sys\n") and len(queries) == 1


def test_stat_cache_never_answers_for_an_edit_that_kept_size_inode_and_mtime(tmp_path):
    """A same-size edit in place with the old mtime put back (``touch -r``, ``cp -p``) changes
    the ctime, which is in the key: hashed again (a stranger's wrong-bytes cache hit)."""
    f = tmp_path / "calib.txt"
    f.write_bytes(b"A" * 100)
    time.sleep(RACY_NS / 1e9 + 0.1)
    sc = StatCache(tmp_path / "sc.sqlite")
    a = sc.file_digest(f)
    assert sc.file_digest(f) == a and sc.hits == 1  # settled: kept
    st = f.stat()
    with open(f, "r+b") as h:  # same inode, same size
        h.write(b"B" * 100)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    assert sc.file_digest(f) == xxhash.xxh3_128_hexdigest(b"B" * 100)


def test_stat_cache_keeps_no_digest_of_a_racily_clean_file(tmp_path):
    """On a file system with 1-second timestamps (ext4 with 128-byte inodes, loop-mounted; FAT and
    some network mounts alike) two same-size writes within one second keep every stat field,
    ctime too: a digest taken right after the first must not answer for the second."""
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "8M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-I", "128", "-F", str(img)], check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        f = mnt / "calib.txt"
        sc = StatCache(tmp_path / "sc.sqlite")

        def fields(st):
            return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

        # the condition itself, measured rather than timed: the second write kept every stat
        # field of the first (both within one timestamp tick); a loaded machine that let a
        # tick pass between them tries again
        for _ in range(20):
            f.write_bytes(b"A" * 100)
            first = fields(f.stat())
            a = sc.file_digest(f)
            with open(f, "r+b") as h:
                h.write(b"B" * 100)
            if fields(f.stat()) == first:
                break
        assert fields(f.stat()) == first, "no two writes kept every stat field in 20 tries"
        assert a == xxhash.xxh3_128_hexdigest(b"A" * 100) and first[2] % 1_000_000_000 == 0  # 1 s stamps
        assert sc.file_digest(f) == xxhash.xxh3_128_hexdigest(b"B" * 100)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


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
    from tasks.core import keys
    from tasks.core.session import Session
    from tasks.recipe.plan import StageSpec

    def code_digest(spec):
        return keys.code_digest(Session(), spec)

    def spec(*names):
        return StageSpec("r", "patch", "patch", {"steps": [{"name": n, "version": 1, "params": {}} for n in names]})

    a, b = code_digest(spec("mask-range")), code_digest(spec("fold-constants"))
    assert a != b and len(a) == 32
    assert code_digest(spec("mask-range")) == a  # stable
    assert code_digest(StageSpec("r", "export", "export", {}, family="encoder")) != code_digest(
        StageSpec("r", "compile", "compile", {}, family="encoder")
    )
