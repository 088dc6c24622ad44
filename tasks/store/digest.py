"""Content digests: xxh3-128 of files and folders, canonical JSON, and the stat cache.

- ``canonical_json(obj)``: the one serialisation that keys are hashed from (sorted keys,
  no whitespace, UTF-8), as DVC does for its run-cache (``dvc/stage/cache.py``).
- ``file_digest(path)``: xxh3-128 hex of a file's bytes, streamed in 1 MiB chunks (bounded
  memory), memoised in a :class:`StatCache` keyed by (path, inode, size, mtime_ns), as
  dvc-data's ``hashfile/state.py`` does, so an unchanged multi-GB file is not read again.
- ``tree_digest(folder)``: xxh3-128 of the canonical JSON of {relative POSIX path: file
  digest}; names and contents count, timestamps and permissions do not.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sqlite3
import sys
import threading
from pathlib import Path

import xxhash

from tasks.errors import UserError

CHUNK = 1 << 20  # bytes per read; xxhash releases the GIL above 64 KiB


def canonical_json(obj) -> str:
    """Serialise ``obj`` as canonical JSON: sorted keys, ``(",", ":")`` separators,
    non-ASCII kept. Raises TypeError for values JSON cannot hold."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest_json(obj) -> str:
    """xxh3-128 hex digest (32 chars) of ``canonical_json(obj)``."""
    return xxhash.xxh3_128_hexdigest(canonical_json(obj).encode("utf-8"))


def digest_bytes(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def hash_file_uncached(path: Path) -> str:
    """xxh3-128 hex digest of a file, streamed (``hashlib.file_digest`` with a 1 MiB buffer)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, xxhash.xxh3_128).hexdigest()


#: a file whose mtime or ctime is this recent may still change without its stat changing (a
#: second write within the file system's timestamp granularity: git's "racily clean" entries);
#: FAT's 2 s granularity is the coarsest a project may sit on
RACY_NS = 2_000_000_000


class StatCache:
    """Maps (absolute path, inode, size, mtime_ns, ctime_ns) to the file's xxh3-128 digest.

    Kept in SQLite (WAL mode) so that several doit processes can share it. A file whose stat
    changed is hashed again; a row never answers for a different stat. The ctime is in the key
    because a user can restore an mtime (``touch -r``, ``cp -p``) but not a ctime; and a digest
    is not kept for a file changed less than :data:`RACY_NS` before it was read, nor for one
    whose stat moved while it was read, since a second edit within the file system's timestamp
    granularity (1 s on ext4 with 128-byte inodes, 2 s on FAT) keeps every stat field.
    ``reads`` counts the bytes actually read from disk by this instance (used by benchmarks and
    tests). A row this instance read or wrote is also remembered in memory under the same stat
    key, so a file asked for again (a module's digest for its imports, then for the code digest)
    costs one ``stat``, not another query.
    """

    def __init__(self, db_path: Path):
        self.db_path = Path(db_path)
        self.db_path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._seen: dict[str, tuple] = {}  # absolute path -> (stat key, digest), rows read or written here
        self.bytes_read = 0
        self.hits = 0

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._open_waiting()
            except sqlite3.DatabaseError as e:  # not a database, or damaged: it is only a cache
                if not damaged(e):
                    raise unwritable(self.db_path, e, "the stat cache") from None
                reset_database(self.db_path, e, "the stat cache")
                conn = self._open()
            self._local.conn = conn
        return conn

    def _open_waiting(self) -> sqlite3.Connection:
        """:meth:`_open`, waiting up to :data:`BUSY_WAIT` seconds while another process holds
        the database (SQLITE_BUSY / SQLITE_LOCKED at the WAL switch)."""
        import time

        deadline = time.monotonic() + BUSY_WAIT
        while True:
            try:
                return self._open()
            except sqlite3.DatabaseError as e:
                if not (busy(e) and time.monotonic() < deadline):
                    raise
                time.sleep(0.05)

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, timeout=60)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS stat2 (path TEXT PRIMARY KEY, inode INTEGER,"
                " size INTEGER, mtime_ns INTEGER, ctime_ns INTEGER, digest TEXT)"
            )
            conn.execute(
                "CREATE TABLE IF NOT EXISTS derived (what TEXT, digest TEXT, value TEXT, PRIMARY KEY (what, digest))"
            )
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def file_digest(self, path: Path) -> str:
        """Digest of ``path``, from the cache when its stat is unchanged. Raises OSError if
        the file cannot be read. A stat cache that turns out damaged is rebuilt (one warning)."""
        import time

        path = Path(path).absolute()
        st = path.stat()
        key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        seen = self._seen.get(str(path))
        if seen is not None and seen[0] == key:
            self.hits += 1
            return seen[1]
        attempt, deadline = 0, time.monotonic() + BUSY_WAIT
        while True:
            conn = self._conn()
            try:
                row = conn.execute(
                    "SELECT inode, size, mtime_ns, ctime_ns, digest FROM stat2 WHERE path=?", (str(path),)
                ).fetchone()
                if row and tuple(row[:4]) == key:
                    self.hits += 1
                    self._seen[str(path)] = (key, row[4])
                    return row[4]
                started = time.time_ns()
                digest = hash_file_uncached(path)
                self.bytes_read += st.st_size
                after = path.stat()
                settled = (
                    max(st.st_mtime_ns, st.st_ctime_ns) <= started - RACY_NS
                    and (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns) == key
                )
                if settled:  # else hashed again next time: the file may still change unseen
                    with conn:
                        conn.execute("INSERT OR REPLACE INTO stat2 VALUES (?,?,?,?,?,?)", (str(path), *key, digest))
                    self._seen[str(path)] = (key, digest)
                return digest
            except sqlite3.DatabaseError as e:
                if busy(e) and time.monotonic() < deadline:  # another process writes: wait for it
                    time.sleep(0.05)
                    continue
                if not damaged(e):
                    raise unwritable(self.db_path, e, "the stat cache") from None
                if attempt:
                    raise
                attempt += 1
                conn.close()
                self._local.conn = None
                reset_database(self.db_path, e, "the stat cache")

    def derived(self, what: str, digest: str, compute, reader: Path | None = None) -> str | None:
        """A text ``compute()`` derives from content with xxh3 ``digest`` (e.g. the imports of
        a source file), kept across processes under ``(what, digest)``: computed once per
        content, never answering for other content. ``compute``: a callable returning str, or
        None for "do not keep" (then None is returned). ``reader``: the source file that does
        the deriving; its digest joins ``what``, so a change to that code is not answered by
        values its old version stored."""
        try:
            if reader is not None:
                what = f"{what}:{self.file_digest(reader)}"
            conn = self._conn()
            row = conn.execute("SELECT value FROM derived WHERE what=? AND digest=?", (what, digest)).fetchone()
        except (sqlite3.DatabaseError, OSError):  # damaged (file_digest rebuilds it), read-only: compute
            return compute()
        if row:
            return row[0]
        value = compute()
        if value is None:
            return None
        try:
            with conn:
                conn.execute("INSERT OR REPLACE INTO derived VALUES (?,?,?)", (what, digest, value))
        except sqlite3.DatabaseError:
            pass
        return value


class StoreUnwritable(UserError):
    """A database npubuild keeps (the stat cache) cannot be written: a full disk, a read-only
    file, no permission. Nothing is moved or lost; one line says which file and what to do."""


#: SQLite's primary result codes for a file that is not (or no longer) a database
SQLITE_DAMAGED = {11: "SQLITE_CORRUPT", 26: "SQLITE_NOTADB"}


#: seconds a stat cache access waits while another process holds the database
BUSY_WAIT = 60.0


def busy(err: Exception) -> bool:
    """Whether SQLite error ``err`` is another connection holding the database (SQLITE_BUSY,
    SQLITE_LOCKED): wait and retry, it is neither damage nor a full disk."""
    code = getattr(err, "sqlite_errorcode", None)
    if code is None:
        return "database is locked" in str(err)
    return code & 0xFF in (5, 6)


def damaged(err: Exception) -> bool:
    """Whether SQLite error ``err`` says the file is damaged (corrupt, not a database), as
    opposed to a disk that is full, a read-only file or a lock: those leave a valid stat cache
    in place, never moved aside as damaged."""
    code = getattr(err, "sqlite_errorcode", None)
    return code is None and not isinstance(err, sqlite3.OperationalError) or (code or 0) & 0xFF in SQLITE_DAMAGED


def unwritable(path: Path, err: Exception, what: str) -> StoreUnwritable:
    """The one-line error for a database ``path`` that cannot be written (``damaged`` is False)."""
    name = getattr(err, "sqlite_errorname", type(err).__name__)
    hint = (
        "free space on that disk or point NPUBUILD_HOME to another"
        if "full" in str(err)
        else "make it writable by this user or point NPUBUILD_HOME elsewhere"
    )
    return StoreUnwritable(f"{path}: {what} cannot be written ({name}: {err}); {hint}; nothing was moved or lost")


def reset_database(path: Path, err: Exception, what: str) -> Path | None:
    """Move an SQLite database that cannot be read (and its -wal/-shm files) aside to
    ``<name>.damaged-<time>`` and say so in one line on stderr; the caller then creates it
    anew. For databases that only cache what can be recomputed (the stat cache, doit's
    database). Returns where it went (None if it was not there)."""
    import time

    path = Path(path)
    dest = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    moved = None
    for suffix in ("", "-wal", "-shm"):
        f = Path(str(path) + suffix)
        if f.exists():
            os.replace(f, str(dest) + suffix)
            moved = moved or dest
    print(
        f"npubuild: {path}: {what} could not be read ({type(err).__name__}: {err}); moved to {dest} "
        f"and rebuilt (nothing is lost but time)",
        file=sys.stderr,
        flush=True,
    )
    return moved


_default: StatCache | None = None
_default_env: tuple | None = None


def _report_io() -> None:  # NPUBUILD_STATS=1: what this process hashed and read (benchmarks)
    io = {}
    try:
        io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    except OSError:
        pass
    c = _default
    print(
        f"npubuild-stats hashed_bytes={c.bytes_read if c else 0} stat_hits={c.hits if c else 0} "
        f"rchar={io.get('rchar', '?').strip()} pydantic={int('pydantic' in sys.modules)}",
        file=sys.stderr,
    )


if os.environ.get("NPUBUILD_STATS"):
    atexit.register(_report_io)


def default_stat_cache() -> StatCache:
    """The process-wide stat cache, at ``$NPUBUILD_HOME/statcache.sqlite`` (default
    ``.npubuild/`` in the project root)."""
    global _default, _default_env
    env = (os.environ.get("NPUBUILD_HOME"), os.environ.get("NPUBUILD_ROOT"))
    if _default is not None and env == _default_env:  # the common case, without path work
        return _default
    from tasks.store.paths import state_dir

    want = state_dir() / "statcache.sqlite"
    if _default is None or _default.db_path != want:
        _default = StatCache(want)
    _default_env = env
    return _default


def file_digest(path: Path) -> str:
    """xxh3-128 hex of a file's bytes, through the default stat cache."""
    return default_stat_cache().file_digest(path)


def list_files(folder: Path) -> list[Path]:
    """All regular files under ``folder``, sorted by relative POSIX path. Symlinks to files
    are followed; hidden lock files (``*.lock``) are skipped."""
    folder = Path(folder)
    out = [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def tree_listing(folder: Path) -> dict[str, dict]:
    """{relative POSIX path: {"size": bytes, "xxh3": digest}} for every file under ``folder``."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "xxh3": file_digest(p)} for p in list_files(folder)
    }


def listing_digest(listing: dict[str, dict]) -> str:
    """Digest of a folder listing: only relative paths and content digests count."""
    return digest_json({k: v["xxh3"] for k, v in listing.items()})


def tree_digest(folder: Path) -> str:
    """xxh3-128 of a folder's content (names + bytes). Raises FileNotFoundError if absent."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"not a folder: {folder}")
    return listing_digest(tree_listing(folder))


def xxh3_and_sha256(path: Path) -> tuple[str, str]:
    """(xxh3-128 hex, sha256 hex) of a file's bytes, read once in CHUNK-sized blocks, never
    from the stat cache: what publish ships is checked against the cache manifest (xxh3)
    and listed with a standard hash (sha256) from the same read. Raises OSError."""
    x, h = xxhash.xxh3_128(), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            x.update(chunk)
            h.update(chunk)
    return x.hexdigest(), h.hexdigest()


def sha256_file(path: Path) -> str:
    """sha256 hex of a file (for published manifests, where a standard hash is expected)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class InputChanged(UserError):
    """A file a stage reads no longer holds the bytes its key hashed (it was edited while the
    build ran): nothing is cached; the next build hashes it again."""


def snapshot(files: dict[str, Path], expected: dict[str, str], names: dict[str, str], folder: Path) -> dict[str, Path]:
    """Copy each data file ``files[role]`` into ``folder/role/`` (same base name) and return
    the copies' paths by role, after checking that each copy's bytes are the ones the stage key
    hashed (``expected[role]``, xxh3-128 hex; the copy is hashed in full, never through the stat
    cache). A stage that reads the copies reads exactly what its key says, whatever happens to
    the originals meanwhile. ``names[role]``: the file as the recipe names it, for messages.
    Raises InputChanged naming the file and both digests."""
    import shutil

    out = {}
    for role, src in files.items():
        dest = Path(folder) / role / Path(src).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        got = hash_file_uncached(dest)
        if got != expected[role]:
            raise InputChanged(
                f"{names[role]}: changed while the build ran (the stage key hashed xxh3 "
                f"{expected[role][:16]}, the file now holds {got[:16]}); nothing was cached: "
                f"build again to use its new content"
            )
        out[role] = dest
    return out


def links_out(folder: Path, roots: list[Path], files: list[Path] | None = None) -> list[tuple[str, Path]]:
    """``[(relative POSIX path, resolved target)]`` for every file under ``folder`` (or of
    ``files``) that resolves, through symlinks, outside every folder of ``roots`` (resolved
    paths): the links a source folder may not follow (README, ``NPUBUILD_ALLOW_PATHS``)."""
    folder = Path(folder)
    bad = []
    for f in files if files is not None else list_files(folder):
        real = f.resolve()
        if not any(real.is_relative_to(r) for r in roots):
            bad.append((f.relative_to(folder).as_posix(), real))
    return bad
