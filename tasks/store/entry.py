"""One entry of the stage cache (:mod:`tasks.store.entries`, ``cache/<kind>/<key>/{manifest.json,
out/...}``): :class:`Entry` (where it is, its manifest, where it came from), the check of an
entry folder against its manifest (:func:`entry_problems`: sizes and mtimes, a rehash where an
mtime moved or on request) and :class:`EntryUnreadable`, another user's entry (not damage).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from tasks.store import digest
from tasks.errors import UserError


class EntryUnreadable(UserError):
    """A cache entry this user may not read (another user's, made under umask 077 in a shared
    cache). It is not damage: it is neither used nor moved aside."""

    def __init__(self, path: Path):
        try:
            st = Path(path).stat()
            whose = f"it belongs to uid {st.st_uid}, mode {st.st_mode & 0o777:04o}"
        except OSError:
            whose = "its owner and mode cannot be read either"
        super().__init__(
            f"{path}: this user (uid {os.getuid()}) cannot read this cache entry ({whose}); it is "
            "another user's: ask them to make the shared cache's entries group-readable (umask 002), "
            "or set NPUBUILD_CACHE to a cache of your own"
        )


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


def entry_problems(path: Path, key: str, full: bool = False) -> list[str] | None:
    """None if no entry folder ``path`` exists; else the list of ways the entry (``key``: its
    folder's name) differs from its manifest (empty = intact): manifest unreadable, another key,
    files not listed, missing, another size or other content. ``full=True`` rehashes every
    output file (uncached); otherwise a file is rehashed only when its mtime moved. Raises
    PermissionError for an entry this user may not read (:meth:`tasks.store.entries.Cache.problems`
    turns it into :class:`EntryUnreadable`)."""
    mpath = path / "manifest.json"
    if not path.exists():
        return None
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
        listed = m.get("outputs", {})
        for meta in listed.values():
            int(meta["size"]), str(meta["xxh3"])
    except PermissionError:
        raise  # another user's entry, not damage (problems)
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as e:
        return [f"manifest.json unreadable or malformed: {type(e).__name__}: {e}"]
    out = []
    if m.get("key") != key:
        out.append(f"manifest key {m.get('key')} != folder name {key}")
    present = (
        {p.relative_to(path / "out").as_posix() for p in digest.list_files(path / "out")}
        if (path / "out").is_dir()
        else set()
    )
    for rel in sorted(present - set(listed)):
        out.append(f"{rel}: not in the manifest")
    for rel, meta in sorted(listed.items()):
        f = path / "out" / rel
        try:
            st = f.stat()
        except PermissionError:
            raise
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
