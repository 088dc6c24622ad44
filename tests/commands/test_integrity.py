"""Issue 14: what publish ships, what check_bundle and reproduce compare, and bundle signatures,
through the real doit CLI on the tiny BERT.

One module-scoped project with two recipes, ``a`` and ``b``, whose stages agree, so that
``build/a/`` and ``build/b/`` hard-link the same cache entries. The damaging tests come last.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import Project

from tasks.store import digest
from tasks.commands.publish.check import check_bundle
from tasks.commands.publish.errors import PublishError
from tasks.commands.publish.signing import SIGNATURE


@pytest.fixture(scope="module")
def proj(tmp_path_factory, tiny_bert) -> Project:
    p = Project(tmp_path_factory.mktemp("integrity") / "proj", tiny_bert)
    p.recipe("a")
    p.recipe("b")
    p.doit("run", "build:a", "build:b")
    p.doit("run", "publish:a")
    return p


def _bundle(proj) -> Path:
    return proj.root / "dist" / "a"


def _damage(f: Path, at: int = 100, n: int = 64) -> None:
    """Flip ``n`` bytes of ``f`` at ``at``, keeping its size and mtime (and its read-only bit)."""
    st = f.stat()
    os.chmod(f, 0o644)
    with open(f, "r+b") as fh:
        fh.seek(at)
        data = fh.read(n)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.chmod(f, st.st_mode)


# ------------------------------------------------------------ manifests that are not one (fault 11)


@pytest.mark.parametrize(
    "files, words",
    [
        (["model_ctx.onnx"], "files: expected an object {relative path: {sha256, size}}, found a list"),
        (
            {"model_ctx.onnx": {"sha256": "0" * 64}},
            "files.model_ctx.onnx.size: expected an integer >= 0, found nothing",
        ),
        (
            {"model_ctx.onnx": {"sha256": "xyz", "size": "12"}},
            "files.model_ctx.onnx.size: expected an integer >= 0, "
            'found a string "12"; files.model_ctx.onnx.sha256: '
            "expected 64 lowercase hex digits",
        ),
        (
            {"../../etc/passwd": {"sha256": "0" * 64, "size": 1}},
            "files.../../etc/passwd: expected a relative path inside",
        ),
        (None, "files: expected an object {relative path: {sha256, size}}, found nothing"),
    ],
)
def test_malformed_bundle_manifest_is_one_message(proj, tmp_path, files, words):
    b = tmp_path / "a"
    shutil.copytree(_bundle(proj), b)
    m = json.loads((b / "manifest.json").read_text())
    if files is None:
        del m["files"]
    else:
        m["files"] = files
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(PublishError) as e:
        check_bundle(b)
    assert str(e.value).startswith(f"{b / 'manifest.json'}: ") and words in str(e.value)
    if isinstance(files, list):  # and through the command line, once
        run = proj.doit("run", "check_bundle", "--path", str(b), check=False)
        assert run.code != 0 and words in run.log() and "Traceback" not in run.log()
        assert "does not match its manifest (or its signature)" not in run.log()  # one message, not two


def test_oversized_bundle_manifest_is_refused_unread(proj, tmp_path):
    b = tmp_path / "a"
    shutil.copytree(_bundle(proj), b)
    with open(b / "manifest.json", "r+b") as f:  # sparse: 200 MB without writing them
        f.truncate(200 * 1000**2)
    t0 = time.monotonic()
    with pytest.raises(
        PublishError,
        match=r"expected at most 16777216 bytes \(MANIFEST_MAX_BYTES\), "
        r"found 200000000 bytes; not read",
    ):
        check_bundle(b)
    assert time.monotonic() - t0 < 1.0


# ------------------------------------------------------------ signatures (fault 12)


def _ec_keypair(folder: Path, name: str) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    priv.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return priv, pub


def test_signed_bundle_catches_consistent_tampering(proj, tmp_path):
    priv, pub = _ec_keypair(tmp_path, "builder")
    _, other_pub = _ec_keypair(tmp_path, "someone-else")
    dist = tmp_path / "dist"
    env = dict(proj.env, NPUBUILD_DIST=str(dist))
    signer = Project.__new__(Project)
    signer.root, signer.env = proj.root, env
    signer.doit("run", "publish:a", "--sign", str(priv))
    b = dist / "a"
    (archive,) = dist.glob("a-*.tar.gz")
    assert (b / SIGNATURE).is_file() and archive.with_name(archive.name + ".sig").is_file()
    # the archive holds no signature, so it stays byte-identical to an unsigned publish
    (plain,) = (proj.root / "dist").glob("a-*.tar.gz")
    assert digest.sha256_file(archive) == digest.sha256_file(plain)

    assert check_bundle(b, public_key=pub) == {"mismatch": [], "missing": [], "extra": [], "signature": []}
    assert proj.doit("run", "check_bundle", "--path", str(b), "--public-key", str(pub)).code == 0
    wrong = check_bundle(b, public_key=other_pub)["signature"]
    assert len(wrong) == 1 and wrong[0].startswith(f"{SIGNATURE}: does not verify against {other_pub}")
    unchecked = check_bundle(b)["signature"]
    assert unchecked and "expected --public-key or --cert-chain" in unchecked[0]

    # consistent tampering: a file changed and its manifest entry updated; sha256 alone passes
    v = b / "verify.json"
    v.write_text(v.read_text().replace('"backend": "cpu-qdq"', '"backend": "htp"'))
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["verify.json"] = {"sha256": digest.sha256_file(v), "size": v.stat().st_size}
    (b / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    res = check_bundle(b, public_key=pub)
    assert res["mismatch"] == res["missing"] == res["extra"] == [] and len(res["signature"]) == 1
    assert res["signature"] == [
        f"{SIGNATURE}: does not verify against {pub}: files changed since signing: manifest.json, verify.json"
    ]
    run = proj.doit("run", "check_bundle", "--path", str(b), "--public-key", str(pub), check=False)
    assert run.code != 0 and "SIGNATURE npubuild.sig: does not verify" in run.log()

    # variant: the signature removed; a verifier that expects one still fails
    (b / SIGNATURE).unlink()
    assert check_bundle(b, public_key=pub)["signature"] == [
        f"{SIGNATURE}: expected a signature (a key to check one was given), found none"
    ]


def _ca_and_leaf(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """A self-made CA and a code-signing leaf certificate it issued: (CA pem, leaf pem, leaf key pem)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    day = datetime.timedelta(days=1)

    def usage(sign_certs: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=not sign_certs,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=sign_certs,
            crl_sign=sign_certs,
            encipher_only=False,
            decipher_only=False,
        )

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage(True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - day)
        .not_valid_after(now + day)
        .add_extension(usage(False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out = (folder / f"{name}-ca.pem", folder / f"{name}-cert.pem", folder / f"{name}-key.pem")
    out[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    out[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    out[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return out


def test_certificate_signed_bundle(proj, tmp_path):
    """Variant: signed with a certificate its CA issued; checked against that CA, not another."""
    ca, cert, key = _ca_and_leaf(tmp_path, "builder")
    other_ca, _, _ = _ca_and_leaf(tmp_path, "stranger")
    signer = Project.__new__(Project)
    signer.root, signer.env = proj.root, dict(proj.env, NPUBUILD_DIST=str(tmp_path / "dist"))
    signer.doit("run", "publish:a", "--sign", str(key), "--signing-cert", str(cert), "--cert-chain", str(ca))
    b = tmp_path / "dist" / "a"
    assert proj.doit("run", "check_bundle", "--path", str(b), "--cert-chain", str(ca)).code == 0
    (bad,) = check_bundle(b, cert_chain=[other_ca])["signature"]
    assert bad.startswith(f"{SIGNATURE}: does not verify against {other_ca}: ")
    v = b / "verify.json"
    v.write_text(v.read_text() + " ")
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["verify.json"] = {"sha256": digest.sha256_file(v), "size": v.stat().st_size}
    (b / "manifest.json").write_text(json.dumps(m))
    assert check_bundle(b, cert_chain=[ca])["signature"] == [
        f"{SIGNATURE}: does not verify against {ca}: files changed since signing: manifest.json, verify.json"
    ]


def test_sign_with_a_key_that_is_not_one_names_it(proj, tmp_path):
    bad = tmp_path / "key.pem"
    bad.write_text("not a key\n")
    signer = Project.__new__(Project)
    signer.root, signer.env = proj.root, dict(proj.env, NPUBUILD_DIST=str(tmp_path / "dist"))
    run = signer.doit("run", "publish:a", "--sign", str(bad), check=False)
    assert run.code != 0 and f"{bad}: cannot sign" in run.log()


# ------------------------------------------------------------ shipped corruption (fault 1); damages the cache


def _entry_of(proj, kind: str) -> Path:
    (key,) = proj.entries(kind)
    return proj.cache / kind / key


def test_reproduce_rechecks_the_published_side_first(proj):
    """A published file changed in dist/ (its manifest kept): reproduce refuses before any
    rebuild, naming the file."""
    saved = _bundle(proj).with_name("a.saved")
    shutil.copytree(_bundle(proj), saved)
    try:
        _damage(_bundle(proj) / "model_ctx_qnn.bin")
        t0 = time.monotonic()
        run = proj.doit("run", "reproduce:a", check=False)
        assert (
            run.code != 0
            and "the published bundle does not match its manifest.json (mismatch model_ctx_qnn.bin: sha256 differs)"
            in run.log()
        )
        assert time.monotonic() - t0 < 30  # refused up front, nothing rebuilt
    finally:
        shutil.rmtree(_bundle(proj))
        saved.rename(_bundle(proj))


def test_damaged_cache_file_is_never_shipped_and_build_links_are_cleared(proj):
    """The issue's case: 64 bytes of the cached context binary flipped, size and mtime kept."""
    compile_entry = _entry_of(proj, "compile")
    binf = compile_entry / "out" / "model_ctx_qnn.bin"
    for r in ("a", "b"):
        assert os.path.samefile(proj.root / "build" / r / "model_ctx_qnn.bin", binf)
    published = digest.sha256_file(_bundle(proj) / "model_ctx_qnn.bin")
    _damage(binf)
    assert proj.doit("run", "build:a", "build:b").ran() == []  # size and mtime kept: the stat check sees nothing

    run = proj.doit("run", "publish:a", check=False)
    assert run.code != 0 and "Traceback" not in run.log()
    assert (
        f"refusing to publish model_ctx_qnn.bin: cache entry compile/{compile_entry.name} file "
        f"model_ctx_qnn.bin does not match its manifest" in run.log()
    )
    assert digest.sha256_file(_bundle(proj) / "model_ctx_qnn.bin") == published  # dist/ left as it was
    assert not compile_entry.exists() and any((proj.cache / ".damaged").iterdir())
    for r in ("a", "b"):  # both build/ folders that linked to it lose its files and artifacts.json
        for f in ("model_ctx_qnn.bin", "model_ctx.onnx", "artifacts.json"):
            assert not (proj.root / "build" / r / f).exists(), (r, f)
        assert (proj.root / "build" / r / "verify.json").exists()
    again = proj.doit("run", "build:a", "build:b")
    assert [n for n in again.ran() if n.startswith("compile")] in (["compile:a"], ["compile:b"])
    for r in ("a", "b"):
        art = json.loads((proj.root / "build" / r / "artifacts.json").read_text())
        for f, src in art.items():
            assert os.path.samefile(proj.root / "build" / r / f, proj.cache / src)
    assert proj.doit("run", "cache_verify").code == 0

    # variant: another kind and file (the export's tokenizer.json, shipped too), found by reproduce
    # before it rebuilds anything: the published bundle came from that entry
    export_entry = _entry_of(proj, "export")
    _damage(export_entry / "out" / "tokenizer.json", at=10, n=8)
    run = proj.doit("run", "reproduce:a", check=False)
    assert (
        run.code != 0
        and f"was published from cache entry export/{export_entry.name} (stage export), which is "
        f"damaged: tokenizer.json: content differs (xxh3)"
        in run.log()
    )
    assert not export_entry.exists()
    proj.doit("run", "build:a", "build:b")
    proj.doit("run", "publish:a")
    assert check_bundle(_bundle(proj)) == {"mismatch": [], "missing": [], "extra": []}


def test_an_entry_edited_in_place_is_called_damaged_not_stale(proj):
    """A cache entry's file edited in place (its mtime moves: the entry no longer matches its
    manifest): publish refused it as "stale ... the recipe or a tool changed" (a breaker's case:
    nothing of the recipe or the tools had changed). It now says the entry is damaged and names
    the commands that recover; after them, publish ships the original bytes again."""
    entry = _entry_of(proj, "export")
    f = entry / "out" / "tokenizer_config.json"
    original = f.read_bytes()
    os.chmod(f, 0o644)
    f.write_bytes(original.replace(b"}", b', "edited": 1}', 1))
    run = proj.doit("run", "publish:a", check=False)
    assert run.code != 0 and "Traceback" not in run.log()
    line = next(ln for ln in run.log().splitlines() if "refusing to publish a" in ln)
    assert "a cache entry it ships is damaged" in line and "export/" in line and "doit cache_verify" in line, line
    assert "the recipe or a tool changed" not in line
    moved = proj.doit("run", "cache_verify", check=False)  # moves it aside (and exits 1: it found one)
    assert f"DAMAGED export/{entry.name}: tokenizer_config.json" in moved.log() and not entry.exists()
    proj.doit("run", "build:a", "build:b")
    proj.doit("run", "publish:a")
    assert (_bundle(proj) / "tokenizer_config.json").read_bytes() == original
