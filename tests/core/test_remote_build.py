"""Checkouts sharing one remote cache, through the real doit CLI on the tiny BERT, on a
``file://`` remote and on a real S3 endpoint (moto_server on 127.0.0.1): a second checkout
pulls everything (0 stages run, byte-identical build/), a tampered remote file is rejected and
rebuilt, an entry without manifest is invisible, existing remote entries are never replaced."""

from __future__ import annotations

import json
import re

from conftest import Project
from remote_contents import build_files, remote_fs, remote_manifests
from tasks.store import digest

KINDS = ["compile", "download", "export", "patch", "quantize", "verify"]
STAGES = {
    "download": "download",
    "export": "export",
    "prepatch": "patch",
    "quantize": "quantize",
    "compile": "compile",
    "verify": "verify",
}


def _status(project: Project, recipe: str) -> dict[str, str]:
    out = project.doit("run", f"explain:{recipe}").tasks[f"explain:{recipe}"]["out"]
    return {
        ln.split(None, 3)[0].split(":")[0]: ln.split(None, 3)[3]
        for ln in out.splitlines()
        if ln and not ln.startswith(" ")
    }


def test_checkouts_share_one_remote(tmp_path, tiny_bert, remote_url):
    a, b, c = (Project(tmp_path / n, tiny_bert) for n in "abc")
    for p in (a, b, c):
        p.env["NPUBUILD_REMOTE"] = remote_url
        p.recipe("t8")

    # checkout A builds everything and pushes each entry as it is built
    first = a.doit("run", "build:t8")
    assert len(first.ran()) == 6
    assert first.log().count("npubuild: pushed ") == 6, first.log()
    remote = remote_manifests(remote_url)
    assert sorted(k.split("/")[0] for k in remote) == KINDS
    assert all(json.loads(m)["key"] == k.split("/")[1] for k, m in remote.items())

    # checkout B (own local cache, same remote): explain sees remote hits, the build runs 0 stages
    assert _status(b, "t8") == {s: "remote hit" for s in STAGES}
    p = b.popen("run", "build:t8")  # the console: each stage says it was pulled (issue 23: it said "cache hit")
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0 and " built " not in out, out
    lines = dict(re.findall(r"^(\S+):t8 +[0-9a-f]{12} +(\S+)", out, re.M))  # stage lines, not verify's figures
    assert {s: lines.get(s) for s in STAGES} == {s: "pulled" for s in STAGES}, out
    built = build_files(b, "t8")
    assert built == build_files(a, "t8")  # byte-identical build/t8/
    assert len(built) == 9 and {"model_ctx.onnx", "model_ctx_qnn.bin", "verify.json", "tokenizer.json"} <= set(built)
    for kind in STAGES.values():
        (key,) = b.entries(kind)
        m = json.loads((b.cache / kind / key / "manifest.json").read_text())
        assert (
            m["remote"]["pulled_from"] == remote_url
            and m["output_digest"] == json.loads(remote[f"{kind}/{key}"])["output_digest"]
        )
    assert _status(b, "t8") == {s: "local hit" for s in STAGES}

    # pushing again replaces nothing
    again = a.doit("run", "push:t8").tasks["push:t8"]["out"]
    assert again.count("already on the remote") == 6, again
    assert remote_manifests(remote_url) == remote

    # tamper with the export entry's largest file on the remote (same size), and remove the
    # verify entry's manifest (a push that died before its last write)
    fs, root = remote_fs(remote_url)
    (ekey,) = a.entries("export")
    em = json.loads(remote[f"export/{ekey}"])
    rel, meta = max(em["outputs"].items(), key=lambda kv: kv[1]["size"])
    target = f"{root}/export/{ekey}/{em['remote']['data']}/{rel}"
    blob = bytearray(fs.cat_file(target))
    blob[len(blob) // 2] ^= 0xFF
    fs.pipe_file(target, bytes(blob))
    assert fs.size(target) == meta["size"]
    (vkey,) = a.entries("verify")
    fs.rm(f"{root}/verify/{vkey}/manifest.json")

    st = _status(c, "t8")
    assert st["verify"] == "not built" and st["export"] == "remote hit"  # manifest-less: invisible
    third = c.doit("run", "build:t8")
    assert third.ran() == ["export:t8", "verify:t8"], third.log()  # the rest pulled
    bad = digest.digest_bytes(bytes(blob))
    assert (
        f"remote entry export/{ekey}: out/{rel}: content differs from manifest.json (xxh3 {bad} != {meta['xxh3']})"
    ) in third.log(), third.log()
    assert f"rejected, building export/{ekey} locally" in third.log()
    # nothing bad was copied: C's export entry is its own build, equal to the manifest
    assert c.entries("export") == [ekey]
    assert digest.hash_file_uncached(c.cache / "export" / ekey / "out" / rel) == meta["xxh3"] != bad
    assert build_files(c, "t8") == build_files(a, "t8")
    # the tampered entry was not overwritten by C's push; the invisible verify entry was pushed anew
    assert f"already on the remote: export/{ekey}" in third.log()
    assert f"pushed verify/{vkey}" in third.log()
    now = remote_manifests(remote_url)
    assert now[f"export/{ekey}"] == remote[f"export/{ekey}"] and fs.cat_file(target) == bytes(blob)
    assert json.loads(now[f"verify/{vkey}"])["remote"]["data"] != json.loads(remote[f"verify/{vkey}"])["remote"]["data"]


def test_push_publishes_entries_built_without_a_remote(tmp_path, tiny_bert):
    """Entries built before the remote existed (their manifests without key material, as
    before issue 10) are published by ``doit push:<recipe>``; another checkout then pulls all."""
    remote_url = (tmp_path / "remote").as_uri()
    a, b = Project(tmp_path / "a", tiny_bert), Project(tmp_path / "b", tiny_bert)
    a.recipe("t8")
    b.recipe("t8")
    assert len(a.doit("run", "build:t8").ran()) == 6
    for kind in KINDS:
        (key,) = a.entries(kind)
        mp = a.cache / kind / key / "manifest.json"
        m = json.loads(mp.read_text())
        m.pop("material")
        mp.chmod(0o644)
        mp.write_text(json.dumps(m))
    no_remote = a.doit("run", "push:t8", check=False)
    assert no_remote.code != 0 and "no remote cache: set NPUBUILD_REMOTE" in no_remote.log()
    a.env["NPUBUILD_REMOTE"] = b.env["NPUBUILD_REMOTE"] = remote_url
    out = a.doit("run", "push:t8").tasks["push:t8"]["out"]
    assert out.count("  pushed") == 6 and f"remote cache: {remote_url}" in out, out
    assert len(remote_manifests(remote_url)) == 6
    assert b.doit("run", "build:t8").ran() == []
    assert build_files(b, "t8") == build_files(a, "t8")


def test_a_rejected_remote_entry_is_said_once(tmp_path, tiny_bert):
    """A remote entry that fails its check: one line for it in a build (the up-to-date check
    and the stage each looked it up, and each said so), and the stage is built locally."""
    remote = tmp_path / "remote"
    remote.mkdir()
    a, b = (Project(tmp_path / n, tiny_bert) for n in "ab")
    for p in (a, b):
        p.env["NPUBUILD_REMOTE"] = remote.as_uri()
        p.recipe("t8")
    a.doit("run", "download:t8")
    (key,) = a.entries("download")
    m = json.loads((remote / "download" / key / "manifest.json").read_text())
    target = remote / "download" / key / m["remote"]["data"] / "config.json"
    target.chmod(0o644)
    target.write_text(target.read_text().replace("{", "{ ", 1)[:-1])  # same size, other bytes
    p = b.popen("run", "download:t8")
    out = p.communicate(timeout=300)[0]
    lines = [ln for ln in out.splitlines() if "; rejected, building" in ln]
    assert p.returncode == 0 and lines == [
        f"npubuild: remote entry download/{key}: out/config.json: content differs "
        f"from manifest.json (xxh3 {digest.file_digest(target)} != "
        f"{m['outputs']['config.json']['xxh3']}); rejected, building download/{key} "
        f"locally (remote {remote.as_uri()})"
    ], out
    assert b.entries("download") == [key]
