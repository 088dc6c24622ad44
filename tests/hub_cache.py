"""A fake local Hugging Face Hub cache, laid out as huggingface_hub writes it (offline download
tests in stages/, sources/ and commands/)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tasks.store import digest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(root: Path, repo: str, files_from: Path, ref: str = "main") -> Path:
    """A Hugging Face Hub cache laid out as huggingface_hub writes it:
    models--org--name/{blobs/<sha>, refs/<ref>, snapshots/<commit>/<file> -> blob}."""
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / ref).write_text(COMMIT)
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "blobs").mkdir()
    for f in files_from.iterdir():
        blob = base / "blobs" / digest.sha256_file(f)
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(Path("../../blobs") / blob.name)
    return root
