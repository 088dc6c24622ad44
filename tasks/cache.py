"""The content-addressed stage cache: ``cache/<kind>/<key>/{manifest.json, out/...}``.

- An entry is built in ``cache/.tmp/`` (same filesystem) and renamed into place only when the
  stage succeeded and its manifest is written: a failed or killed stage leaves no entry, only
  a temp folder that :meth:`Cache.gc` removes.
- A per-key lock (``filelock``) means two processes sharing a cache never build one key twice
  and never read an entry being written.
- Output files are made read-only, as DVC does for linked cache files; the manifest records
  each file's size, mtime_ns and xxh3-128. :meth:`Cache.lookup` checks sizes and mtimes on
  every use (cheap) and rehashes a file whose mtime moved (a cache copied without
  timestamps stays valid); :meth:`Cache.verify` rereads every byte. A damaged entry is moved
  to ``cache/.damaged/`` and rebuilt, never used.
- With a remote (``tasks/remote.py``, ``NPUBUILD_REMOTE``) the cache has two levels: a local
  miss is looked up remotely, downloaded into ``cache/.tmp/``, checked file by file and
  committed by the same rename as a build (:meth:`Cache.fetch`); a stage built here is then
  pushed (:meth:`Cache.push`). A remote entry that fails a check is never copied in.

This module knows nothing of what a stage does: the key check of a remote entry is the
``key_of(manifest)`` function its owner passes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from . import digest
from .remote import Rejected, Remote, RemoteError, warn


def _rmtree(path: Path) -> None:
    def onexc(func, p, exc):  # read-only files (Windows) and read-only dirs
        os.chmod(p, stat.S_IWRITE | stat.S_IREAD | stat.S_IEXEC)
        func(p)

    if path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=onexc)
        else:
            shutil.rmtree(path, onerror=lambda f, p, e: onexc(f, p, e))


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@dataclass
class Entry:
    """A committed cache entry: where it is and its manifest. ``origin`` is "local" (found
    in the local cache), "built" (just built here), "pulled" (just downloaded from the
    remote) or "remote" (seen on the remote only, not downloaded: ``path`` is where it would
    go, and ``out`` does not exist)."""

    kind: str
    key: str
    path: Path
    manifest: dict
    origin: str = "local"

    @property
    def out(self) -> Path:
        return self.path / "out"

    @property
    def output_digest(self) -> str:
        return self.manifest["output_digest"]


class Cache:
    """The local cache at ``root``; with ``remote`` (and ``key_of(manifest) -> key``, the
    stage key recomputed from a manifest's key material) also the remote level."""

    def __init__(self, root: Path, remote: Remote | None = None, key_of: Callable[[dict], str] | None = None):
        if remote is not None and key_of is None:
            raise ValueError("a Cache with a remote needs key_of, to check remote manifests")
        self.root = Path(root)
        self.remote = remote
        self.key_of = key_of

    def entry_path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def _lock(self, kind: str, key: str) -> FileLock:
        d = self.root / ".locks"
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{kind}-{key}.lock"))

    # ------------------------------------------------------------ reading

    def problems(self, kind: str, key: str, full: bool = False) -> list[str] | None:
        """None if no entry exists; else the list of ways the entry differs from its manifest
        (empty = intact). ``full=True`` rehashes every output file (uncached)."""
        path = self.entry_path(kind, key)
        mpath = path / "manifest.json"
        if not path.exists():
            return None
        try:
            m = json.loads(mpath.read_text(encoding="utf-8"))
            listed = m.get("outputs", {})
            for meta in listed.values():
                int(meta["size"]), str(meta["xxh3"])
        except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
            return [f"manifest.json unreadable or malformed: {type(e).__name__}: {e}"]
        out = []
        if m.get("key") != key:
            out.append(f"manifest key {m.get('key')} != folder name {key}")
        present = {p.relative_to(path / "out").as_posix() for p in digest.list_files(path / "out")} \
            if (path / "out").is_dir() else set()
        for rel in sorted(present - set(listed)):
            out.append(f"{rel}: not in the manifest")
        for rel, meta in sorted(listed.items()):
            f = path / "out" / rel
            try:
                st = f.stat()
            except OSError:
                out.append(f"{rel}: missing")
                continue
            if st.st_size != meta["size"]:
                out.append(f"{rel}: size {st.st_size} != {meta['size']}")
            elif full:
                if digest.hash_file_uncached(f) != meta["xxh3"]:
                    out.append(f"{rel}: content differs (xxh3)")
            elif st.st_mtime_ns != meta.get("mtime_ns"):
                # touched or copied without timestamps: only a content change is damage
                # (rehashed once; the stat cache remembers the new stat)
                if digest.file_digest(f) != meta["xxh3"]:
                    out.append(f"{rel}: modified (mtime and content)")
        return out

    def lookup(self, kind: str, key: str) -> Entry | None:
        """The intact entry for (kind, key), or None. A damaged entry is quarantined (moved
        to ``.damaged/``) with a warning on stderr, so the caller rebuilds it."""
        probs = self.problems(kind, key)
        if probs is None:
            return None
        if probs:
            self.quarantine(kind, key, probs)
            return None
        path = self.entry_path(kind, key)
        return Entry(kind, key, path, json.loads((path / "manifest.json").read_text(encoding="utf-8")))

    def quarantine(self, kind: str, key: str, probs: list[str]) -> Path:
        dest = self.root / ".damaged" / f"{kind}-{key}-{uuid.uuid4().hex[:8]}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.entry_path(kind, key), dest)
        print(f"npubuild: cache entry {kind}/{key} is damaged ({'; '.join(probs[:3])}); "
              f"moved to {dest} and rebuilding", file=sys.stderr)
        return dest

    def entries(self):
        """Every committed entry folder as (kind, key, path)."""
        if not self.root.exists():
            return
        for kd in sorted(self.root.iterdir()):
            if kd.is_dir() and not kd.name.startswith("."):
                for e in sorted(kd.iterdir()):
                    if e.is_dir():
                        yield kd.name, e.name, e

    # ------------------------------------------------------------ the remote level

    def fetch(self, kind: str, key: str) -> Entry | None:
        """The intact local entry for (kind, key); else, with a remote, the remote entry
        downloaded, checked and committed locally (``origin="pulled"``); else None. A remote
        entry that fails a check, or a remote that cannot be reached, is reported on stderr
        and counts as a miss (the caller builds the stage). Holds the key's lock while
        pulling; raises only what the local file system raises."""
        hit = self.lookup(kind, key)
        if hit or self.remote is None:
            return hit
        with self._lock(kind, key):
            return self.lookup(kind, key) or self._pull(kind, key)

    def peek_remote(self, kind: str, key: str) -> Entry | None:
        """The remote entry (kind, key) from its checked manifest alone, nothing downloaded
        (``origin="remote"``); None without a remote, when absent, or when its manifest is
        rejected or unreadable (reported on stderr)."""
        if self.remote is None:
            return None
        try:
            m = self.remote.peek(kind, key, self.key_of)
        except (Rejected, RemoteError) as e:
            warn(str(e))
            return None
        return Entry(kind, key, self.entry_path(kind, key), m, "remote") if m else None

    def _tmp(self, kind: str, key: str) -> Path:
        tmp_root = self.root / ".tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        tmp = tmp_root / f"{kind}-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        (tmp / "out").mkdir(parents=True)
        return tmp

    def _commit(self, tmp: Path, kind: str, key: str) -> Path:
        """Rename the finished temp folder (``out/`` + ``manifest.json``) into place."""
        dest = self.entry_path(kind, key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return dest

    def _pull(self, kind: str, key: str) -> Entry | None:  # caller holds the key's lock
        tmp = self._tmp(kind, key)
        try:
            m = self.remote.pull(kind, key, tmp / "out", self.key_of)
            if m is None:
                _rmtree(tmp)
                return None
            _write_json(tmp / "manifest.json", m)
            dest = self._commit(tmp, kind, key)
        except Rejected as e:
            _rmtree(tmp)
            warn(f"{e}; rejected, building {kind}/{key} locally (remote {self.remote.display})")
            return None
        except RemoteError as e:
            _rmtree(tmp)
            warn(f"remote cache unavailable ({e}); building {kind}/{key} locally")
            return None
        except BaseException:
            _rmtree(tmp)
            raise
        return Entry(kind, key, dest, m, "pulled")

    def push(self, kind: str, key: str, material: dict | None = None) -> bool:
        """Publish the local entry (kind, key) to the remote (files first, manifest last,
        never replacing an existing remote entry). ``material``, the entry's key material,
        is added to the pushed manifest when the local one lacks it (entries built before
        remotes existed). Returns True when published, False when the remote already had
        it. Raises ValueError without a remote, KeyError when there is no intact local
        entry, Rejected when the manifest's key material does not hash to ``key``, and
        RemoteError on a transfer error."""
        if self.remote is None:
            raise ValueError("no remote cache configured (set NPUBUILD_REMOTE)")
        e = self.lookup(kind, key)
        if e is None:
            raise KeyError(f"no intact local entry {kind}/{key}")
        m = dict(e.manifest)
        if "material" not in m and material is not None:
            m["material"] = material
        return self.remote.push(kind, key, e.out, m, self.key_of)

    # ------------------------------------------------------------ writing

    def get_or_build(self, kind: str, key: str, manifest_base: dict,
                     build: Callable[[Path], dict]) -> tuple[Entry, bool]:
        """Return (entry, built). If an intact entry exists it is returned (a cache hit);
        else, with a remote, a checked remote entry is pulled (:meth:`fetch`); otherwise
        ``build(out_dir)`` runs in a temp folder, must fill ``out_dir`` and return a JSON-able
        dict of extra manifest info, and the folder is committed atomically, then pushed to
        the remote (a push error is reported on stderr, not raised: the build stands).

        Holds the per-key lock for the whole build. Any exception from ``build`` removes the
        temp folder and propagates; nothing is committed.
        """
        with self._lock(kind, key):
            hit = self.lookup(kind, key) or (self._pull(kind, key) if self.remote else None)
            if hit:
                return hit, False
            tmp = self._tmp(kind, key)
            try:
                t0 = time.time()
                info = build(tmp / "out") or {}
                seconds = time.time() - t0
                listing = {}
                for f in digest.list_files(tmp / "out"):
                    os.chmod(f, stat.S_IREAD | stat.S_IRGRP | stat.S_IROTH)
                    st = f.stat()
                    listing[f.relative_to(tmp / "out").as_posix()] = {
                        "size": st.st_size, "mtime_ns": st.st_mtime_ns, "xxh3": digest.file_digest(f)}
                manifest = dict(manifest_base, key=key, kind=kind, outputs=listing,
                                output_digest=digest.listing_digest(listing), info=info,
                                timings={"build_seconds": round(seconds, 3), "finished": time.time()})
                _write_json(tmp / "manifest.json", manifest)
                dest = self._commit(tmp, kind, key)
            except BaseException:
                _rmtree(tmp)
                raise
        entry = Entry(kind, key, dest, manifest, "built")
        if self.remote is not None:
            try:
                pushed = self.remote.push(kind, key, entry.out, manifest, self.key_of)
                print(f"npubuild: {'pushed' if pushed else 'already on the remote:'} {kind}/{key} "
                      f"({self.remote.display})", flush=True)
            except (Rejected, RemoteError) as e:
                warn(f"could not push {kind}/{key}: {e}")
        return entry, True

    # ------------------------------------------------------------ maintenance

    def verify(self, quarantine: bool = True) -> dict[str, list[str]]:
        """Rehash every entry fully. Returns {"kind/key": problems} for damaged entries and,
        unless ``quarantine=False``, moves them to ``.damaged/`` so the next build rebuilds
        them (a damage that kept size and mtime is invisible to the per-build check)."""
        bad = {}
        for kind, key, _ in list(self.entries()):
            with self._lock(kind, key):
                probs = self.problems(kind, key, full=True)
                if probs:
                    bad[f"{kind}/{key}"] = probs
                    if quarantine:
                        self.quarantine(kind, key, probs)
        return bad

    def gc(self, referenced: set[tuple[str, str]], apply: bool = False) -> list[tuple[str, int]]:
        """Entries not in ``referenced`` (a set of (kind, key)), plus leftover temp and
        damaged folders, as [(relative path, bytes)]. Removes them only when ``apply``.
        A temp folder whose key lock is held (a build in progress) is kept."""
        victims = []
        for kind, key, path in self.entries():
            if (kind, key) not in referenced:
                victims.append(path)
        for special in (".tmp", ".damaged"):
            d = self.root / special
            if d.is_dir():
                for p in sorted(d.iterdir()):
                    if special == ".tmp":
                        kind, key = p.name.split("-")[:2]
                        lock = self._lock(kind, key)
                        try:
                            lock.acquire(timeout=0)
                        except Exception:
                            continue
                        lock.release()
                    victims.append(p)
        out = []
        for p in victims:
            size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            out.append((p.relative_to(self.root).as_posix(), size))
            if apply:
                _rmtree(p)
        return out
