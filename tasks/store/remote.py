"""A remote second level for the stage cache, over any fsspec file system.

``NPUBUILD_REMOTE`` names it with an fsspec URL: ``file:///shared/folder``, ``s3://bucket/prefix``,
``gs://bucket/prefix``, ... Credentials come from the backend's usual environment (for S3:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE``, ...; fsspec's
``FSSPEC_<PROTOCOL>_<OPTION>`` variables); they are never printed: messages name the URL with
any ``user:password@`` removed. For S3, ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (or
``FSSPEC_S3_ENDPOINT_URL``) points at another S3 server (MinIO, moto in the tests).

Layout of the remote, per entry::

    <url>/<kind>/<key>/manifest.json        the local manifest + "material" (the key material)
                                           + "remote": {"data": "data-<upload id>"}
    <url>/<kind>/<key>/data-<upload id>/... the entry's output files

**Publishing** (:meth:`Remote.push`): the files go first, into a folder named after this
upload, and ``manifest.json`` last, with the backend's create-if-absent, so an entry without
a manifest is invisible to readers and an existing entry is never overwritten. Two machines
pushing one key at once each write their own data folder; the one whose manifest lands first
wins and the other's folder is left unreferenced (a build that is not byte-reproducible cannot
mix files of two builds). What "create if absent" guarantees per backend:

- ``file://`` (a local or network folder): the manifest is written to a temp file and
  hard-linked into place; ``link()`` fails when the name exists, atomically on a local disk and
  on NFS v3+/SMB servers that implement links. Where links are missing it falls back to
  ``open(..., "xb")`` (``O_EXCL``), also exclusive, but a reader may then see a half-written
  manifest for an instant: it is rejected, not used, and the stage built locally.
- ``s3://`` (s3fs): ``PutObject`` with ``If-None-Match: *`` (AWS S3 since 2024-08, MinIO,
  moto): the store refuses to replace an object, atomically. A store that ignores the header
  would let a second concurrent push replace the manifest; both manifests are then complete
  and each names its own data folder, so a reader still gets one consistent entry.
- any other backend (``gs://`` with gcsfs, ...): fsspec's ``pipe_file(mode="create")``; where
  the backend does not implement it natively this is an exists check followed by a write
  (a race window between two pushers of the same key, with the same outcome as above).

**Reading** (:meth:`Remote.pull`): an entry counts only when its manifest exists; it is checked
before any file is copied (kind and key fields, the key material hashes to the key, the
output digest matches the file listing, every path stays inside the entry), then each file is
downloaded into the caller's folder and its size and xxh3 compared with the manifest. Any
failure raises :class:`Rejected`, naming the key and the file.

This module knows nothing of stages: the caller passes ``key_of(manifest) -> key``.
"""

from __future__ import annotations

import json
import os
import posixpath
import sys
import time
import uuid
from functools import lru_cache
from pathlib import Path, PurePosixPath
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from tasks.store import digest
from tasks.errors import InputError, NpubuildError, UserError

ENV = "NPUBUILD_REMOTE"


class RemoteError(UserError):
    """The remote could not be read or written (network, permissions, missing bucket...).
    ``repeated``: the error is one this process already met and reported (the remote is not
    tried again in this run), so callers do not warn again: one unreachable server is one
    line."""

    def __init__(self, message: str, repeated: bool = False):
        super().__init__(message)
        self.repeated = repeated


class Rejected(NpubuildError):
    """A remote entry failed a check; the message names the entry's key and the bad file."""


def redact(url: str) -> str:
    """``url`` without any ``user:password@`` part, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=host))


def _storage_options(protocol: str) -> dict:
    if protocol in ("s3", "s3a"):
        import fsspec.config

        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and not fsspec.config.conf.get("s3", {}).get("endpoint_url"):
            return {"endpoint_url": endpoint}
    if protocol in ("file", "local"):
        return {"auto_mkdir": True}
    return {}


def _relative_local(url: str) -> str | None:
    """The path of local-folder URL ``url`` (``/abs``, ``file:///abs``, ``file://relative``,
    ``local://x``, ``relpath``) when it is relative, else None: fsspec would take it from the
    current folder, which under doit is the project's."""
    import ntpath

    rest = url
    for scheme in ("file://", "local://", "file:", "local:"):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            break
    if rest.startswith("localhost/"):
        rest = rest[len("localhost") :]
    return None if rest.startswith("/") or ntpath.isabs(rest) and ntpath.splitdrive(rest)[0] else rest


class Remote:
    """One remote cache at an fsspec URL. Raises ValueError for a URL fsspec cannot open
    (unknown protocol, or its backend package is not installed) and for a local folder given
    by a relative path (as for ``NPUBUILD_CACHE``)."""

    def __init__(self, url: str):
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        self.url = url
        self.display = redact(url)
        protocol = fsspec.utils.get_protocol(url)
        if protocol in ("file", "local") and (rel := _relative_local(url)) is not None:
            raise InputError(
                f"{ENV}={self.display!r}: expected an absolute path or file:///absolute/path (doit "
                f"changes into the dodo.py folder), found the relative path {rel!r}"
            )
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **_storage_options(protocol))
        except (ImportError, ValueError) as e:
            raise InputError(
                f"{ENV}={self.display}: cannot open it with fsspec ({type(e).__name__}: {e}; "
                "s3:// needs s3fs, gs:// gcsfs)"
            ) from None
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, LocalFileSystem)
        # the first read / write error of this process, after which reads / writes fail fast
        # (an unreachable server costs its retries once; read-only credentials still pull)
        self.down: dict[str, str] = {}
        # (kind, key) of the entries rejected in this process -> the message, until it is said
        # (then None): not downloaded or said again (a doit command asks for an entry in its
        # up-to-date check and again in the stage: tasks/store/entries.py says it once)
        self.rejected: dict[tuple[str, str], str | None] = {}

    def _unavailable(self, what: str, e: BaseException, op: str = "read") -> RemoteError:
        self.down[op] = f"{self.display}: {what}: {type(e).__name__}: {e}"
        return RemoteError(self.down[op])

    def _check_up(self, op: str = "read") -> None:
        if op in self.down:
            raise RemoteError(f"{self.down[op]} (earlier in this run; not retried)", repeated=True)

    def __repr__(self) -> str:
        return f"Remote({self.display!r})"

    # ------------------------------------------------------------ layout

    def entry_url(self, kind: str, key: str) -> str:
        return f"{self.root}/{kind}/{key}"

    def manifest_url(self, kind: str, key: str) -> str:
        return f"{self.entry_url(kind, key)}/manifest.json"

    # ------------------------------------------------------------ reading

    def read_manifest(self, kind: str, key: str) -> dict | None:
        """The remote manifest of (kind, key) as stored, or None when there is none (an
        entry without a manifest does not exist). Raises Rejected for a manifest that is not
        a JSON object, RemoteError when the remote cannot be read (then every later call of
        this process fails fast: an unreachable server costs its retries once)."""
        self._check_up()
        try:
            raw = self.fs.cat_file(self.manifest_url(kind, key))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self._unavailable(f"reading {kind}/{key}/manifest.json", e) from None
        try:
            m = json.loads(raw)
        except ValueError as e:
            raise Rejected(f"remote entry {kind}/{key}: manifest.json is not JSON ({e})") from None
        if not isinstance(m, dict):
            raise Rejected(f"remote entry {kind}/{key}: manifest.json is not a JSON object")
        return m

    def check_manifest(self, kind: str, key: str, m: dict, key_of: Callable[[dict], str]) -> None:
        """Check a manifest without reading any output file: its kind and key fields, that
        ``key_of(m)`` (the key recomputed from its key material) is ``key``, that its output
        digest is that of its file listing, and that every listed path is a plain relative
        path. Raises Rejected naming the key and what is wrong."""
        where = f"remote entry {kind}/{key}"
        if m.get("kind") != kind or m.get("key") != key:
            raise Rejected(f"{where}: manifest.json names {m.get('kind')}/{m.get('key')}")
        try:
            recomputed = key_of(m)
        except Exception as e:
            raise Rejected(f"{where}: manifest.json has no usable key material ({type(e).__name__}: {e})") from None
        if recomputed != key:
            raise Rejected(f"{where}: manifest.json's key material hashes to {recomputed}, not to its key")
        outs = m.get("outputs")
        if not isinstance(outs, dict):
            raise Rejected(f"{where}: manifest.json has no output listing")
        for rel, meta in outs.items():
            p = PurePosixPath(rel)
            if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or rel != posixpath.normpath(rel):
                raise Rejected(f"{where}: out/{rel}: not a plain relative path")
            if not (isinstance(meta, dict) and isinstance(meta.get("size"), int) and isinstance(meta.get("xxh3"), str)):
                raise Rejected(f"{where}: out/{rel}: manifest lists no size/xxh3 for it")
        if m.get("output_digest") != digest.listing_digest(outs):
            raise Rejected(f"{where}: manifest.json's output_digest is not that of its file listing")
        data = (m.get("remote") or {}).get("data")
        if not isinstance(data, str) or not data.startswith("data-") or "/" in data:
            raise Rejected(f"{where}: manifest.json names no data folder (remote.data)")

    def peek(self, kind: str, key: str, key_of: Callable[[dict], str]) -> dict | None:
        """The checked remote manifest of (kind, key) without downloading any file, or None
        (absent). Raises Rejected (a bad manifest) or RemoteError (unreachable)."""
        m = self.read_manifest(kind, key)
        if m is not None:
            self.check_manifest(kind, key, m, key_of)
        return m

    def pull(self, kind: str, key: str, out: Path, key_of: Callable[[dict], str]) -> dict | None:
        """Download the entry (kind, key) into the empty local folder ``out``, checking every
        file's size and xxh3 against the checked manifest. Returns the manifest with each
        output's ``mtime_ns`` set to the local copy's (files made read-only), or None when the
        remote has no such entry. Raises Rejected (naming the key and the file; ``out`` may
        then hold partial files: the caller discards the folder) or RemoteError."""
        m = self.peek(kind, key, key_of)
        if m is None:
            return None
        where = f"remote entry {kind}/{key}"
        data = f"{self.entry_url(kind, key)}/{m['remote']['data']}"
        outs = m["outputs"]
        for rel, meta in sorted(outs.items()):
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.fs.get_file(f"{data}/{rel}", str(dest))
            except FileNotFoundError:
                raise Rejected(f"{where}: out/{rel}: listed in manifest.json but missing on the remote") from None
            except Exception as e:
                raise self._unavailable(f"downloading {kind}/{key} out/{rel}", e) from None
            os.chmod(dest, 0o444)
            st = dest.stat()
            if st.st_size != meta["size"]:
                raise Rejected(f"{where}: out/{rel}: size {st.st_size} != {meta['size']} in manifest.json")
            got = digest.file_digest(dest)  # the stat cache then knows the new local file
            if got != meta["xxh3"]:
                raise Rejected(f"{where}: out/{rel}: content differs from manifest.json (xxh3 {got} != {meta['xxh3']})")
            meta["mtime_ns"] = st.st_mtime_ns
        m["remote"] = dict(m["remote"], pulled_from=self.display)
        return m

    # ------------------------------------------------------------ writing

    def _create(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` only if nothing is there. True when written."""
        if self.local:
            tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            except OSError:  # no hard links on this file system: O_EXCL
                try:
                    with open(path, "xb") as f:
                        f.write(data)
                    return True
                except FileExistsError:
                    return False
            finally:
                os.unlink(tmp)
        try:
            self.fs.pipe_file(path, data, mode="create")
            return True
        except FileExistsError:
            return False

    def push(self, kind: str, key: str, out: Path, manifest: dict, key_of: Callable[[dict], str]) -> bool:
        """Publish the local entry whose output folder is ``out`` and whose manifest (with its
        key material) is ``manifest``: every file into a fresh ``data-<id>`` folder, then
        ``manifest.json`` with create-if-absent. Returns True when published, False when the
        remote already had the entry (left untouched). Raises Rejected when the manifest
        fails :meth:`check_manifest` (nothing is uploaded) and RemoteError on a transfer
        error (an unreferenced data folder may be left; readers never see it)."""
        data = f"data-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}"
        m = {k: v for k, v in manifest.items() if k != "remote"}
        m["remote"] = {"data": data}
        self.check_manifest(kind, key, m, key_of)
        self._check_up("write")
        try:
            if self.read_manifest(kind, key) is not None:
                return False
        except Rejected:
            return False  # an entry is there, even if unreadable: never replace it
        base = f"{self.entry_url(kind, key)}/{data}"
        try:
            for rel in sorted(m["outputs"]):
                self.fs.put_file(str(out / rel), f"{base}/{rel}")
            blob = (json.dumps(m, indent=2, sort_keys=True) + "\n").encode("utf-8")
            return self._create(self.manifest_url(kind, key), blob)
        except Exception as e:
            raise self._unavailable(f"uploading {kind}/{key}", e, "write") from None


@lru_cache(maxsize=8)
def _remote(url: str) -> Remote:
    return Remote(url)


def from_env() -> Remote | None:
    """The remote named by ``$NPUBUILD_REMOTE``, or None when it is unset or empty. Raises
    ValueError when fsspec cannot open the URL."""
    url = os.environ.get(ENV, "").strip()
    return _remote(url) if url else None


def warn(message: str) -> None:
    print(f"npubuild: {message}", file=sys.stderr, flush=True)
