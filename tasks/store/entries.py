"""The content-addressed stage cache: ``cache/<kind>/<key>/{manifest.json, out/...}``.

- An entry is built in ``cache/.tmp/`` (same filesystem) and renamed into place only when the
  stage succeeded and its manifest is written: a failed or killed stage leaves no entry, only
  a temp folder that :meth:`Cache.gc` removes.
- A per-key lock (``filelock``, :class:`KeyLock`) means two processes sharing a cache never
  build one key twice and never read an entry being written. The lock file names its holder
  (pid, host, since when); a waiter says so once, and gives up after ``NPUBUILD_LOCK_TIMEOUT``
  seconds (default 600) when that holder is stopped (SIGSTOP) or gone while the lock is still
  held (a child it left behind); a running holder, or one on another host, is waited for. The
  lock file is removed on release, so ``cache/.locks`` holds only the locks in use.
- A build first removes the ``.tmp`` folders and lock files of dead builds (a SIGKILL leaves
  them): a temp folder whose key lock nobody holds has no owner (:meth:`Cache.clean_stale`).
- Output files are made read-only, as DVC does for linked cache files; the manifest records
  each file's size, mtime_ns and xxh3-128. :meth:`Cache.lookup` checks sizes and mtimes on
  every use (cheap) and rehashes a file whose mtime moved (a cache copied without
  timestamps stays valid); :meth:`Cache.verify` rereads every byte, and so does publish for
  what it ships (:meth:`Cache.confirm_damage`). A damaged entry is moved to ``cache/.damaged/``
  and rebuilt, never used; the owner's ``on_quarantine`` hook then marks what links to it
  (``build/<recipe>/`` folders: ``tasks.core.resolve.unlink_build_copies``).
- A full disk while building is one :class:`DiskFull` error naming the folder, what was
  written and what is free, not a traceback from deep in a stage.
- With a remote (``tasks/store/remote.py``, ``NPUBUILD_REMOTE``) the cache has two levels: a local
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
from pathlib import Path
from collections.abc import Callable

from tasks.store import digest
from tasks.store.fileops import (
    DISK_NEARLY_FULL,
    DiskFull,
    folder_bytes,
    free_bytes,
    is_disk_full,
    rmtree,
    temp_area,
    write_json,
)
from tasks.store.entry import Entry, EntryUnreadable, entry_problems
from tasks.store.keylock import KeyLock
from tasks.store.remote import Rejected, Remote, RemoteError, warn


class Cache:
    """The local cache at ``root``; with ``remote`` (and ``key_of(manifest) -> key``, the
    stage key recomputed from a manifest's key material) also the remote level. ``cleaned``:
    the roots already rid of dead builds' leftovers (:meth:`clean_stale`): a command's caches
    share its session's; by default this cache's own."""

    def __init__(
        self,
        root: Path,
        remote: Remote | None = None,
        key_of: Callable[[dict], str] | None = None,
        on_quarantine: Callable[[str, str], list] | None = None,
        cleaned: set[str] | None = None,
    ):
        if remote is not None and key_of is None:
            raise ValueError("a Cache with a remote needs key_of, to check remote manifests")
        self.root = Path(root)
        self.remote = remote
        self.key_of = key_of
        self.on_quarantine = on_quarantine  # (kind, key) -> what was marked (for the message)
        self.cleaned = set() if cleaned is None else cleaned
        # a remote entry this cache rejects is said by the next cache that looks it up and does
        # not defer: doit's up-to-date checks defer, so the stage that then builds it says it (in
        # its own output, which doit's JSON reporter keeps; the checks' output it does not)
        self.defer_rejections = False

    def entry_path(self, kind: str, key: str) -> Path:
        return self.root / kind / key

    def _lock(self, kind: str, key: str) -> KeyLock:
        d = self.root / ".locks"
        d.mkdir(parents=True, exist_ok=True)
        return KeyLock(d / f"{kind}-{key}.lock", f"{kind}/{key}")

    # ------------------------------------------------------------ reading

    def problems(self, kind: str, key: str, full: bool = False) -> list[str] | None:
        """None if no entry exists; else the list of ways the entry differs from its manifest
        (empty = intact). ``full=True`` rehashes every output file (uncached). Raises
        EntryUnreadable for an entry this user may not read (not damage: nothing is moved)."""
        try:
            return entry_problems(self.entry_path(kind, key), key, full)
        except PermissionError:
            raise EntryUnreadable(self.entry_path(kind, key)) from None

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
        """Move the entry to ``.damaged/`` (the next build rebuilds it), say so on stderr, and
        call ``on_quarantine(kind, key)`` so that what links to it is marked. Returns where it went."""
        dest = self.root / ".damaged" / f"{kind}-{key}-{uuid.uuid4().hex[:8]}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.entry_path(kind, key), dest)
        marked = self.on_quarantine(kind, key) if self.on_quarantine else []
        print(
            f"npubuild: cache entry {kind}/{key} is damaged ({'; '.join(probs[:3])}); moved to {dest}; "
            f"the next build rebuilds it"
            + (f"; cleared its files from {', '.join(map(str, marked))}" if marked else ""),
            file=sys.stderr,
        )
        return dest

    def confirm_damage(self, kind: str, key: str, probs: list[str]) -> Path | None:
        """A reader that re-hashed files of entry (kind, key) found ``probs``: under the key's
        lock, rehash the whole entry and quarantine it if it is still damaged (not rebuilt in
        the meantime). Returns the ``.damaged/`` folder, or None when the entry is (now) intact
        or gone."""
        with self._lock(kind, key):
            found = self.problems(kind, key, full=True)
            if not found:
                return None
            return self.quarantine(kind, key, found)

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
        if (kind, key) in self.remote.rejected:
            self._say_rejected(kind, key)
            return None
        try:
            m = self.remote.peek(kind, key, self.key_of)
        except (Rejected, RemoteError) as e:
            if isinstance(e, Rejected):
                self.remote.rejected[(kind, key)] = str(e)
                self._say_rejected(kind, key)
            elif not e.repeated:
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

    def _say_rejected(self, kind: str, key: str) -> None:
        """Say, once per process, why the remote entry (kind, key) was rejected; not while
        :attr:`defer_rejections` (the next lookup by a cache that does not defer says it)."""
        msg = self.remote.rejected.get((kind, key))
        if msg is not None and not self.defer_rejections:
            self.remote.rejected[(kind, key)] = None
            warn(f"{msg}; rejected, building {kind}/{key} locally (remote {self.remote.display})")

    def _pull(self, kind: str, key: str) -> Entry | None:  # caller holds the key's lock
        if (kind, key) in self.remote.rejected:  # not downloaded again; said once
            self._say_rejected(kind, key)
            return None
        tmp = self._tmp(kind, key)
        try:
            m = self.remote.pull(kind, key, tmp / "out", self.key_of)
            if m is None:
                rmtree(tmp)
                return None
            write_json(tmp / "manifest.json", m)
            dest = self._commit(tmp, kind, key)
        except Rejected as e:
            rmtree(tmp)
            self.remote.rejected[(kind, key)] = str(e)
            self._say_rejected(kind, key)
            return None
        except RemoteError as e:
            rmtree(tmp)
            if not e.repeated:  # said once per run: later stages neither try nor say it again
                warn(
                    f"remote cache unavailable ({e}); building {kind}/{key} locally, and every later stage of "
                    f"this run without trying the remote again"
                )
            return None
        except BaseException:
            rmtree(tmp)
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

    def get_or_build(
        self, kind: str, key: str, manifest_base: dict, build: Callable[[Path], dict]
    ) -> tuple[Entry, bool]:
        """Return (entry, built). If an intact entry exists it is returned (a cache hit);
        else, with a remote, a checked remote entry is pulled (:meth:`fetch`); otherwise
        ``build(out_dir)`` runs in a temp folder, must fill ``out_dir`` and return a JSON-able
        dict of extra manifest info, and the folder is committed atomically, then pushed to
        the remote (a push error is reported on stderr, not raised: the build stands).

        Holds the per-key lock for the whole build. Any exception from ``build`` removes the
        temp folder and propagates; nothing is committed.
        """
        self.clean_stale()
        with self._lock(kind, key):
            hit = self.lookup(kind, key) or (self._pull(kind, key) if self.remote else None)
            if hit:
                return hit, False
            tmp = self._tmp(kind, key)
            try:
                t0 = time.time()
                with temp_area(tmp / "work"):
                    info = build(tmp / "out") or {}
                seconds = time.time() - t0
                listing = {}
                for f in digest.list_files(tmp / "out"):
                    os.chmod(f, stat.S_IREAD | stat.S_IRGRP | stat.S_IROTH)
                    st = f.stat()
                    listing[f.relative_to(tmp / "out").as_posix()] = {
                        "size": st.st_size,
                        "mtime_ns": st.st_mtime_ns,
                        "xxh3": digest.file_digest(f),
                    }
                manifest = dict(
                    manifest_base,
                    key=key,
                    kind=kind,
                    outputs=listing,
                    output_digest=digest.listing_digest(listing),
                    info=info,
                    timings={"build_seconds": round(seconds, 3), "finished": time.time()},
                )
                write_json(tmp / "manifest.json", manifest)
                dest = self._commit(tmp, kind, key)
            except BaseException as e:
                # a library that met the full disk may fail later and otherwise (protobuf's
                # DecodeError reading a graph cut short): an error with the disk full is the disk
                full = is_disk_full(e) or (isinstance(e, Exception) and free_bytes(tmp.parent) < DISK_NEARLY_FULL)
                written = folder_bytes(tmp) if full else 0
                rmtree(tmp)
                if full:
                    free = shutil.disk_usage(tmp.parent).free
                    raise DiskFull(
                        f"{tmp.parent}: no space left on its device while building {kind}/{key}: the stage "
                        f"needs more than the {free / 1e6:.1f} MB free there (it had written "
                        f"{written / 1e6:.1f} MB when the disk filled); free space or set NPUBUILD_CACHE "
                        f"to a larger disk"
                    ) from None
                raise
        entry = Entry(kind, key, dest, manifest, "built")
        if self.remote is not None:
            try:
                pushed = self.remote.push(kind, key, entry.out, manifest, self.key_of)
                print(
                    f"npubuild: {'pushed' if pushed else 'already on the remote:'} {kind}/{key} "
                    f"({self.remote.display})",
                    flush=True,
                )
            except (Rejected, RemoteError) as e:
                if not getattr(e, "repeated", False):
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
                    if special == ".tmp" and not self._unowned_tmp(p):
                        continue
                    victims.append(p)
        out = []
        for p in victims:
            size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            out.append((p.relative_to(self.root).as_posix(), size))
            if apply:
                rmtree(p)
        return out

    def _unowned_tmp(self, p: Path) -> bool:
        """Whether temp folder ``p`` (``<kind>-<key>-<pid>-<random>``) belongs to no running
        build: its key's lock is free (a build holds it for as long as its temp folder
        exists). A name of another form is left alone."""
        parts = p.name.split("-")
        if len(parts) < 4:
            return False
        lock = self._lock(parts[0], parts[1])
        if not lock.try_acquire():
            return False
        lock.release()
        return True

    def clean_stale(self) -> list[str]:
        """Remove what dead builds left (once per root and ``cleaned``): ``.tmp/`` folders whose
        key lock is free (:meth:`_unowned_tmp`; a SIGKILL'd build leaves its temp folder) and
        lock files nobody holds (each is taken, then removed while held). Returns the removed
        names, relative to the cache root; reports them on stderr."""
        if str(self.root) in self.cleaned:
            return []
        self.cleaned.add(str(self.root))
        gone = []
        tmp = self.root / ".tmp"
        for p in sorted(tmp.iterdir()) if tmp.is_dir() else []:
            if p.is_dir() and self._unowned_tmp(p):
                rmtree(p)
                gone.append(f".tmp/{p.name}")
        locks = self.root / ".locks"
        for f in sorted(locks.glob("*.lock")) if locks.is_dir() else []:
            lock = KeyLock(f, f.stem)
            if lock.try_acquire():
                lock.release()
        if gone:
            print(f"npubuild: removed {len(gone)} temp folder(s) of dead builds: {', '.join(gone)}", file=sys.stderr)
        return gone
