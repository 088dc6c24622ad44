"""The remote cache level on its own (tasks/store/remote.py + Cache), against a real ``file://`` folder
and a real S3 endpoint (moto_server on 127.0.0.1): pull with checks, tampered files,
manifest-less entries, no overwrite, key material that does not hash to its key."""

from __future__ import annotations

import json
import os

import fsspec
import pytest

from tasks.store import digest
from tasks.store.entries import Cache
from tasks.core.keys import remote_key, stage_key
from tasks.store.remote import Rejected, Remote

MATERIAL = {"kind": "export", "version": 1, "params": {"n": 1}}
KEY = stage_key(MATERIAL)


def _build(content: bytes):
    def build(out):
        (out / "a.bin").write_bytes(content)
        (out / "sub").mkdir()
        (out / "sub" / "b.txt").write_text("hello")
        return {"n": 2}

    return build


def _cache(root, url) -> Cache:
    return Cache(root, Remote(url), remote_key)


def _fs(url):
    """The remote's file system, seen directly (not through tasks/store/remote.py)."""
    opts = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]} if url.startswith("s3://") else {}
    fs, root = fsspec.core.url_to_fs(url, **opts)
    fs.invalidate_cache()
    return fs, root.rstrip("/")


def _data_dirs(url, kind="export", key=KEY) -> list[str]:
    fs, root = _fs(url)
    names = (p.rstrip("/").rsplit("/", 1)[1] for p in fs.ls(f"{root}/{kind}/{key}", detail=False))
    return sorted(n for n in names if n.startswith("data-"))


def test_build_pushes_and_other_cache_pulls_checked_copy(tmp_path, remote_url):
    c1 = _cache(tmp_path / "c1", remote_url)
    e1, built = c1.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    assert built and e1.origin == "built"
    fs, root = _fs(remote_url)
    remote_m = json.loads(fs.cat_file(f"{root}/export/{KEY}/manifest.json"))
    assert remote_m["key"] == KEY and remote_m["material"] == MATERIAL
    assert remote_m["outputs"]["a.bin"]["xxh3"] == digest.digest_bytes(b"\x01" * 1000)
    assert _data_dirs(remote_url) == [remote_m["remote"]["data"]]

    c2 = _cache(tmp_path / "c2", remote_url)
    assert c2.lookup("export", KEY) is None
    seen = c2.peek_remote("export", KEY)  # explain's view: manifest only, nothing downloaded
    assert seen.origin == "remote" and seen.output_digest == e1.output_digest and not seen.path.exists()
    e2 = c2.fetch("export", KEY)
    assert e2.origin == "pulled" and e2.output_digest == e1.output_digest
    assert (e2.out / "a.bin").read_bytes() == b"\x01" * 1000 and (e2.out / "sub" / "b.txt").read_text() == "hello"
    assert c2.problems("export", KEY, full=True) == []
    assert e2.manifest["remote"]["pulled_from"] == remote_url
    assert list((tmp_path / "c2" / ".tmp").iterdir()) == []
    # the pulled entry is now a plain local hit; get_or_build neither builds nor pushes
    e3, built = c2.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"never"))
    assert not built and e3.origin == "local"


def test_tampered_remote_file_is_rejected_and_rebuilt(tmp_path, remote_url, capsys):
    c1 = _cache(tmp_path / "c1", remote_url)
    c1.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    fs, root = _fs(remote_url)
    (data,) = _data_dirs(remote_url)
    good, bad = b"\x01" * 1000, b"\x01" * 999 + b"\x02"  # same size
    fs.pipe_file(f"{root}/export/{KEY}/{data}/a.bin", bad)
    capsys.readouterr()

    c2 = _cache(tmp_path / "c2", remote_url)
    assert c2.fetch("export", KEY) is None
    err = capsys.readouterr().err
    assert (
        f"remote entry export/{KEY}: out/a.bin: content differs from manifest.json "
        f"(xxh3 {digest.digest_bytes(bad)} != {digest.digest_bytes(good)})"
    ) in err
    assert f"rejected, building export/{KEY} locally" in err
    assert c2.problems("export", KEY) is None and list((tmp_path / "c2" / ".tmp").iterdir()) == []

    e, built = c2.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    assert built and (e.out / "a.bin").read_bytes() == b"\x01" * 1000
    assert f"already on the remote: export/{KEY}" in capsys.readouterr().out
    assert fs.cat_file(f"{root}/export/{KEY}/{data}/a.bin") == bad  # never overwritten
    assert _data_dirs(remote_url) == [data]


def test_entry_without_manifest_is_invisible(tmp_path, remote_url, capsys):
    c1 = _cache(tmp_path / "c1", remote_url)
    c1.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    fs, root = _fs(remote_url)
    (first,) = _data_dirs(remote_url)
    fs.rm(f"{root}/export/{KEY}/manifest.json")  # as if the pusher died before its last write
    capsys.readouterr()

    c2 = _cache(tmp_path / "c2", remote_url)
    assert c2.peek_remote("export", KEY) is None and c2.fetch("export", KEY) is None
    assert capsys.readouterr().err == ""  # not an error: simply not there
    e, built = c2.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    assert built
    assert f"pushed export/{KEY}" in capsys.readouterr().out
    dirs = _data_dirs(remote_url)
    assert len(dirs) == 2 and first in dirs  # the orphan stays, unreferenced
    m = json.loads(fs.cat_file(f"{root}/export/{KEY}/manifest.json"))
    assert m["remote"]["data"] == [d for d in dirs if d != first][0]


def test_existing_remote_entry_is_never_overwritten(tmp_path, remote_url):
    c1 = _cache(tmp_path / "c1", remote_url)
    c1.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    fs, root = _fs(remote_url)
    before = fs.cat_file(f"{root}/export/{KEY}/manifest.json")
    # a second machine whose build of the same key gave other bytes (not reproducible)
    other = Cache(tmp_path / "c3")
    other.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x07" * 1000))
    assert _cache(tmp_path / "c3", remote_url).push("export", KEY) is False
    assert fs.cat_file(f"{root}/export/{KEY}/manifest.json") == before
    # and the create-if-absent write itself refuses an existing name (link() / If-None-Match)
    r = Remote(remote_url)
    assert r._create(r.manifest_url("export", KEY), b"{}") is False
    assert fs.cat_file(f"{root}/export/{KEY}/manifest.json") == before
    pulled = _cache(tmp_path / "c4", remote_url).fetch("export", KEY)
    assert (pulled.out / "a.bin").read_bytes() == b"\x01" * 1000


@pytest.mark.parametrize(
    "corrupt, says",
    ids=["material-edited", "material-missing", "path-escape", "listing-vs-output-digest", "size-lies"],
    argvalues=[
        (lambda m: m["material"]["params"].update(n=2), "key material hashes to"),
        (lambda m: m.pop("material"), "no usable key material"),
        (
            lambda m: m["outputs"].update({"../escape.bin": m["outputs"].pop("a.bin")}),
            "out/../escape.bin: not a plain relative path",
        ),
        (lambda m: m["outputs"]["a.bin"].update(xxh3="0" * 32), "output_digest is not that of its file listing"),
        (lambda m: m["outputs"]["a.bin"].update(size=999), f"remote entry export/{KEY}: out/a.bin: size 1000 != 999"),
    ],
)
def test_bad_remote_manifest_is_rejected_before_any_download(tmp_path, remote_url, capsys, corrupt, says):
    c1 = _cache(tmp_path / "c1", remote_url)
    c1.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 1000))
    fs, root = _fs(remote_url)
    path = f"{root}/export/{KEY}/manifest.json"
    m = json.loads(fs.cat_file(path))
    corrupt(m)
    fs.pipe_file(path, json.dumps(m).encode())
    capsys.readouterr()
    c2 = _cache(tmp_path / "c2", remote_url)
    assert c2.fetch("export", KEY) is None
    err = capsys.readouterr().err
    assert says in err and f"export/{KEY}" in err
    assert not (tmp_path / "c2" / "escape.bin").exists() and list((tmp_path / "c2" / ".tmp").iterdir()) == []


def test_push_refuses_material_that_does_not_hash_to_the_key(tmp_path, remote_url):
    c = Cache(tmp_path / "c")
    wrong = "0" * 32
    c.get_or_build("export", wrong, {"material": MATERIAL}, _build(b"\x01" * 10))
    with pytest.raises(Rejected, match=f"remote entry export/{wrong}: manifest.json's key material hashes to {KEY}"):
        _cache(tmp_path / "c", remote_url).push("export", wrong)
    fs, root = _fs(remote_url)
    assert not fs.exists(f"{root}/export/{wrong}")  # nothing uploaded


def test_unusable_remote_warns_once_and_builds_locally(tmp_path, capsys):
    """One warning for a remote that cannot be used, however many stages follow."""
    (tmp_path / "not-a-folder").write_text("x")  # every remote path under it fails with an OSError
    c = _cache(tmp_path / "c", (tmp_path / "not-a-folder" / "remote").as_uri())
    assert c.fetch("export", KEY) is None
    first = capsys.readouterr().err
    want = f"remote cache unavailable ({c.remote.display}: reading export/{KEY}/manifest.json: NotADirectoryError"
    assert want in first
    e, built = c.get_or_build("export", KEY, {"material": MATERIAL}, _build(b"\x01" * 10))
    assert built and (e.out / "a.bin").read_bytes() == b"\x01" * 10
    err = capsys.readouterr().err
    assert err == "", err  # said once: the same error again is neither retried nor printed (issue 23)
