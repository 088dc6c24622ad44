"""Publishing a bundle to a Hugging Face Hub model repo: ``create_repo(exist_ok=True)``,
``upload_folder`` of the bundle, ``create_tag("npubuild-<short key>")`` on that commit
(:func:`hub_operations`, :func:`push_to_hub`)."""

from __future__ import annotations

from tasks.commands.publish.check import file_count
from tasks.commands.publish.errors import PublishError


def hub_operations(plan: dict, repo_id: str) -> list[tuple[str, dict]]:
    """The Hub calls publish makes, as [(HfApi method, kwargs)]; ``revision`` of create_tag
    is the commit upload_folder returns (shown as ``<commit of upload_folder>``)."""
    return [
        ("create_repo", {"repo_id": repo_id, "repo_type": "model", "exist_ok": True}),
        (
            "upload_folder",
            {
                "repo_id": repo_id,
                "repo_type": "model",
                "folder_path": str(plan["folder"]),
                "commit_message": f"npubuild {plan['recipe']} build {plan['short']}",
            },
        ),
        (
            "create_tag",
            {
                "repo_id": repo_id,
                "repo_type": "model",
                "tag": f"npubuild-{plan['short']}",
                "revision": "<commit of upload_folder>",
                "exist_ok": True,
            },
        ),
    ]


def push_to_hub(plan: dict, repo_id: str, endpoint: str | None = None, token: str | None = None) -> dict:
    """Run :func:`hub_operations` with ``huggingface_hub.HfApi(endpoint, token)`` (defaults:
    ``HF_ENDPOINT``, ``HF_TOKEN`` / the stored login). Returns {"url", "commit", "tag"}.
    Raises PublishError (token scrubbed) when a call fails."""
    from huggingface_hub import HfApi

    from tasks.proc.scrubbing import scrub

    api = HfApi(endpoint=endpoint, token=token)
    ops = hub_operations(plan, repo_id)
    try:
        url = api.create_repo(**ops[0][1])
        print(f"[publish:{plan['recipe']}] Hub repo {url}")
        info = api.upload_folder(**ops[1][1])
        commit = info.oid
        print(f"[publish:{plan['recipe']}] uploaded {file_count(plan['manifest'])} files, commit {commit}")
        tag = dict(ops[2][1], revision=commit)
        api.create_tag(**tag)
        print(f"[publish:{plan['recipe']}] tagged {tag['tag']}")
    except Exception as e:
        raise PublishError(scrub(f"Hub publishing to {repo_id!r} failed: {type(e).__name__}: {e}")) from None
    return {"url": str(url), "commit": commit, "tag": tag["tag"]}
