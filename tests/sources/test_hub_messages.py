"""Issue 14 fault 6: Hub revisions that are not a full commit, and a Hub that cannot be
reached, get messages saying which case it is. A fake local Hugging Face cache laid out as
huggingface_hub writes it (tests/hub_cache.py ``fake_hub_cache``); offline through
HF_HUB_OFFLINE, "no network" through an endpoint on a closed local port (connection refused)."""

from __future__ import annotations

import socket

import pytest
from conftest import TINY_RECIPE, Project
from hub_cache import COMMIT, fake_hub_cache

from tasks.sources import download

REPO = "acme/tiny-bert"


@pytest.fixture
def hub(tmp_path, tiny_bert, monkeypatch):
    from huggingface_hub import constants

    root = fake_hub_cache(tmp_path / "hub", REPO, tiny_bert)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    download.resolve_revision.cache_clear()
    yield root
    download.resolve_revision.cache_clear()


@pytest.fixture
def offline(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def no_network(monkeypatch) -> str:
    """An endpoint nothing listens on: every connection is refused at once."""
    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    return url


def _error(revision: str) -> str:
    with pytest.raises(download.SourceError) as e:
        download.resolve_revision(REPO, revision)
    return str(e.value)


def test_short_commit_offline_names_the_full_one(hub, offline):
    msg = _error(COMMIT[:7])
    assert msg == (
        f"cannot use revision '{COMMIT[:7]}' of Hub model '{REPO}': a short commit hash is not resolved "
        f"offline; write the full 40-hex commit: `revision: {COMMIT}` (found in the local Hugging Face "
        f"cache)"
    )
    assert download.resolve_revision(REPO, "main") == COMMIT  # a branch offline: the local refs


def test_short_commit_offline_variants(hub, offline, tiny_bert):
    other = COMMIT[:10] + "f" * 30  # a second snapshot sharing the first 10 hex digits
    (hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / other).mkdir()
    (hub / f"models--{REPO.replace('/', '--')}" / "snapshots" / other / "config.json").write_text("{}")
    msg = _error(COMMIT[:8])
    assert "it matches 2 commits of the local Hugging Face cache: " in msg and COMMIT in msg and other in msg
    assert f"`revision: {COMMIT}`" in _error(COMMIT[:11])  # longer prefix: unique again
    msg = _error("deadbee")
    assert "has no commit starting with it; write the full 40-hex commit" in msg


def test_branch_without_network_is_a_connection_failure(hub, no_network):
    msg = _error("main")
    assert msg.startswith(
        f"cannot resolve revision 'main' of Hub model '{REPO}': connection to the Hub "
        f"({no_network}) failed, so this says nothing about whether the model exists ["
    )
    assert "not in the local" not in msg
    assert msg.endswith(
        f"; the local Hugging Face cache has main = {COMMIT}: set HF_HUB_OFFLINE=1 to build from it, "
        f"or write `revision: {COMMIT}`"
    )
    # variants: a branch the local cache does not know; a short commit without network
    v2 = _error("release")
    assert "connection to the Hub" in v2 and "local Hugging Face cache has" not in v2
    assert f"write `revision: {COMMIT}`" in _error(COMMIT[:7])


def test_offline_unknown_branch_says_offline_and_not_cached(hub, offline):
    msg = _error("release")
    assert "the Hub is offline (HF_HUB_OFFLINE=1) and it is not in the local Hugging Face cache" in msg


def test_short_commit_in_a_recipe_through_doit(tmp_path, tiny_bert):
    p = Project(tmp_path / "proj", tiny_bert)
    root = fake_hub_cache(tmp_path / "hub", REPO, tiny_bert)
    p.env["HF_HUB_CACHE"] = str(root)
    p.recipe(
        "r",
        TINY_RECIPE.format(precision="w8a16", targets="[x-elite]", backend="cpu-qdq").replace(
            "source: {path: models/tiny-bert}", f"source: {{hf: {REPO}, revision: '{COMMIT[:7]}'}}"
        ),
    )
    run = p.doit("run", "build:r", check=False)
    assert run.code != 0 and "Traceback" not in run.log()
    assert (
        f"SourceError: cannot use revision '{COMMIT[:7]}' of Hub model '{REPO}': a short commit hash is not "
        f"resolved offline; write the full 40-hex commit: `revision: {COMMIT}`" in run.log()
    )


def test_a_library_message_is_kept_whole():
    """Issue 23: the Hub's message was its first line cut at 200 characters."""
    err = OSError(
        "401 Client Error. (Request ID: Root=1-abc)\n\nRepository Not Found for url: "
        "https://huggingface.co/api/models/org/name/revision/main.\n" + "Please make sure " * 20 + "you are "
        "authenticated."
    )
    msg = download._missing("org/name", "main", err)
    assert msg.endswith("Please make sure you are authenticated.]") and "Repository Not Found for url:" in msg
