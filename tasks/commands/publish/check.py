"""Checking a bundle (``doit check_bundle``), its folder or its ``.tar.gz`` archive (unpacked
into a temporary folder first: :func:`unpacked`): its ``manifest.json`` read with care
(:func:`read_manifest`), the sha256 of every file against it (:func:`check_bundle`: mismatches,
missing and extra files; the signature when there is one), printed (:func:`print_check`)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from tasks.store.digest import sha256_file
from tasks.commands.publish.errors import PublishError
from tasks.commands.publish.signing import SIGNATURE, verify_signature

MANIFEST_MAX_BYTES = 16 * 1024**2  # ~100,000 listed files; a larger manifest.json is refused unread
_SHA256 = re.compile(r"[0-9a-f]{64}")


def file_count(manifest: dict) -> int:
    """How many files a bundle holds, the one count publish, ``check_bundle`` and ``reproduce``
    print: every file of the bundle folder, that is the files ``manifest.json`` lists (model
    card included) and ``manifest.json`` itself. Not counted: a signature (``npubuild.sig``,
    written after the bundle, over it) and the ``.tar.gz`` archive (the same files packed)."""
    return len(manifest["files"]) + 1


def _found(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    ) + ("" if isinstance(v, (dict, list)) else f" {json.dumps(v)[:40]}")


def read_manifest(folder: str | Path) -> dict:
    """A bundle's ``manifest.json``, checked before use: at most :data:`MANIFEST_MAX_BYTES`
    (its size is checked before it is read), a JSON object whose ``files`` is an object
    {relative path: {"sha256": 64 hex, "size": int >= 0}}, no path absolute or with ``..``.
    Raises PublishError as ``<file>: <key path>: expected ..., found ...``."""
    f = Path(folder) / "manifest.json"
    try:
        size = f.stat().st_size
    except OSError as e:
        raise PublishError(f"{f}: expected a bundle manifest, found none ({e.strerror})") from None
    if size > MANIFEST_MAX_BYTES:
        raise PublishError(
            f"{f}: expected at most {MANIFEST_MAX_BYTES} bytes (MANIFEST_MAX_BYTES), found {size} bytes; not read"
        )
    try:
        m = json.loads(f.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise PublishError(f"{f}: expected UTF-8 JSON, found {type(e).__name__}: {e}") from None
    if not isinstance(m, dict):
        raise PublishError(f"{f}: expected a JSON object, found {_found(m)}")
    files = m.get("files")
    if not isinstance(files, dict):
        raise PublishError(
            f"{f}: files: expected an object {{relative path: {{sha256, size}}}}, "
            f"found {'nothing' if 'files' not in m else _found(files)}"
        )
    problems = []
    for rel, meta in files.items():
        p = Path(rel)
        if not rel or p.is_absolute() or ".." in p.parts or rel in ("manifest.json", SIGNATURE):
            problems.append(
                f"files.{rel}: expected a relative path inside the bundle (not manifest.json or "
                f"{SIGNATURE}), found {json.dumps(rel)}"
            )
        elif not isinstance(meta, dict):
            problems.append(f"files.{rel}: expected an object {{sha256, size}}, found {_found(meta)}")
        else:
            n, h = meta.get("size"), meta.get("sha256")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                problems.append(
                    f"files.{rel}.size: expected an integer >= 0, found "
                    f"{'nothing' if 'size' not in meta else _found(n)}"
                )
            if not (isinstance(h, str) and _SHA256.fullmatch(h)):
                problems.append(
                    f"files.{rel}.sha256: expected 64 lowercase hex digits, found "
                    f"{'nothing' if 'sha256' not in meta else _found(h)}"
                )
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise PublishError(f"{f}: " + "; ".join(problems[:5]) + more)
    return m


@contextlib.contextmanager
def unpacked(path: str | Path):
    """The bundle folder at ``path``: ``path`` itself when it is a folder; when it is a file
    (a bundle's ``<recipe>-<key>.tar.gz``, as publish writes it), the one top folder of the
    archive unpacked into a temporary folder (removed on exit), with the signature publish
    writes beside the archive (``<archive>.sig``), when there is one, put in as
    :data:`SIGNATURE`. Members are extracted with tarfile's ``data`` filter (no absolute paths,
    ``..``, links out of the folder or device files). Raises PublishError for a path that is
    neither, an archive tarfile cannot read, or one whose members are not all under one folder."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    if not path.is_file():
        raise PublishError(
            f"{path}: expected a bundle folder or its .tar.gz archive, found "
            f"{'nothing' if not path.exists() else 'neither'}"
        )
    with tempfile.TemporaryDirectory(prefix="npubuild-check-") as tmp:
        try:
            with tarfile.open(path, "r:*") as tar:
                tops = {m.name.split("/", 1)[0] for m in tar.getmembers()}
                if len(tops) != 1 or "" in tops or ".." in tops:
                    raise PublishError(
                        f"{path}: expected every member under one folder <recipe>/ (as publish "
                        f"writes it), found {len(tops)} top-level names: {', '.join(sorted(tops)[:5])}"
                    )
                tar.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError, EOFError) as e:
            raise PublishError(f"{path}: expected a bundle's .tar.gz archive, found {type(e).__name__}: {e}") from None
        folder = Path(tmp) / tops.pop()
        sig = path.with_name(path.name + ".sig")
        if sig.is_file() and folder.is_dir():
            shutil.copyfile(sig, folder / SIGNATURE)
        yield folder


def check_bundle(
    folder: str | Path, public_key: str | Path | None = None, cert_chain: list | None = None
) -> dict[str, list[str]]:
    """Recompute the sha256 of every file of a bundle folder (full reads) against its
    manifest.json (:func:`read_manifest`); ``folder`` may be the bundle's archive
    (:func:`unpacked`). Returns {"mismatch": [rel: why], "missing": [rel],
    "extra": [rel]} (all empty = intact); manifest.json and the signature are not listed.
    When the bundle has a signature (:data:`SIGNATURE`) or a trust anchor is given
    (``public_key``: a PEM public key; ``cert_chain``: PEM CA certificates), the result also
    has "signature": [problems] (:func:`verify_signature`); a signature with nothing to check
    it against is a problem, since anyone can sign. Raises PublishError for a manifest that
    is absent, too large or malformed."""
    with unpacked(folder) as folder:
        return _check_folder(folder, public_key, cert_chain)


def _check_folder(folder: Path, public_key, cert_chain) -> dict[str, list[str]]:
    listed = read_manifest(folder)["files"]
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {
        "manifest.json",
        SIGNATURE,
    }
    out = {"mismatch": [], "missing": sorted(set(listed) - present), "extra": sorted(present - set(listed))}
    for rel in sorted(set(listed) & present):
        p, want = folder / rel, listed[rel]
        size = p.stat().st_size
        if size != want["size"]:
            out["mismatch"].append(f"{rel}: size {size} != {want['size']}")
        elif sha256_file(p) != want["sha256"]:
            out["mismatch"].append(f"{rel}: sha256 differs")
    if (folder / SIGNATURE).exists() or public_key or cert_chain:
        out["signature"] = verify_signature(folder, public_key, cert_chain)
    return out


def print_check(folder: str | Path, public_key: str | Path | None = None, cert_chain: list | None = None) -> bool:
    """:func:`check_bundle` (a folder or an archive) with one line per problem and a last line
    with the bundle's :func:`file_count`; True when the bundle is intact (and its signature, if
    any, verifies). Raises PublishError when there is no bundle to check (no or a malformed
    manifest, a key without a signature): one message, not a problem count."""
    with unpacked(folder) as inside:
        res = _check_folder(inside, public_key, cert_chain)
        n = file_count(read_manifest(inside))
    for what in ("mismatch", "missing", "extra", "signature"):
        for item in res.get(what, []):
            print(f"{what.upper()} {item}")
    bad = sum(len(v) for v in res.values())
    sig = "" if "signature" not in res else ", signature " + ("verified" if not res["signature"] else "NOT verified")
    print(
        f"{folder}: {n} files (manifest.json and the {n - 1} it lists), {len(res['mismatch'])} mismatched, "
        f"{len(res['missing'])} missing, {len(res['extra'])} extra{sig}"
    )
    return bad == 0
