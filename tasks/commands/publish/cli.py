"""The publish command's doit tasks (:func:`creators`): ``publish:<recipe>`` (:mod:`.write`),
``reproduce:<recipe>`` (:mod:`.reproduce`) and ``check_bundle`` (:mod:`.check`)."""

from __future__ import annotations

import os

from tasks.core import recipeset
from tasks.core.session import Session
from tasks.errors import UserError, shown


def _publish_action(
    session: Session,
    recipe: str,
    dest: str,
    hub_repo: str,
    dry_run: bool,
    sign: str,
    signing_cert: str,
    cert_chain: str,
):
    from doit.exceptions import TaskFailed

    from tasks.store import outputs
    from tasks.store import paths
    from tasks.commands.publish.write import publish

    if not dry_run and (bad := outputs.unwritable("NPUBUILD_DIST", paths.dist_dir())):
        return TaskFailed(bad)
    if _bare(session, recipe):  # `doit publish`: the verified recipes; the others are said once, at the end
        from tasks.commands.publish.write import refusal

        if why := refusal(recipe, session):
            session.skipped.setdefault("publish", []).append((recipe, why))
            return None
    try:
        publish(
            recipe,
            dest=dest or None,
            hub_repo=hub_repo or None,
            dry_run=dry_run,
            sign=sign or None,
            signing_cert=signing_cert or None,
            cert_chain=_paths_list(cert_chain),
            session=session,
        )
    except UserError as e:  # PublishError, DiskFull, ...
        return TaskFailed(shown(e))


def _bare(session: Session, recipe: str) -> bool:
    """Whether ``publish:<recipe>`` runs because the command line says a bare ``publish`` (every
    recipe) and does not name it."""
    names = session.request.names() if session.request else []
    return "publish" in names and f"publish:{recipe}" not in names


def _reproduce_action(session: Session, recipe: str):
    from doit.exceptions import TaskFailed

    from tasks.commands.publish.reproduce import reproduce

    try:
        same = reproduce(recipe, session=session)
    except UserError as e:
        return TaskFailed(shown(e))
    return True if same else TaskFailed(f"{recipe}: the rebuild is not byte-identical to dist/{recipe}/")


def _check_bundle_action(path: str, public_key: str, cert_chain: str):
    from doit.exceptions import TaskFailed

    from tasks.commands.publish.check import print_check

    if not path:
        return TaskFailed(
            "give the bundle folder or its archive: doit check_bundle --path dist/<recipe> "
            "(or dist/<recipe>-<key>.tar.gz)"
        )
    try:
        ok = print_check(path, public_key or None, _paths_list(cert_chain))
    except UserError as e:
        return TaskFailed(shown(e))
    return True if ok else TaskFailed(f"{path}: bundle does not match its manifest (or its signature)")


_CERT_CHAIN = {
    "name": "cert_chain",
    "long": "cert-chain",
    "type": str,
    "default": "",
    "help": "PEM CA certificate(s) of the signing certificate, separated by os.pathsep",
}


def _paths_list(value: str) -> list[str] | None:
    return [v for v in value.split(os.pathsep) if v] or None


def creators(session: Session) -> dict:
    """{name: doit task creator} of the publish commands, all working in ``session``."""

    def task_publish():
        """publish:<recipe> writes dist/<recipe>/ and its archive from a verified build (never
        builds; refuses a failed, stale or unbuilt recipe); --dest, --hub-repo, --dry-run, --sign.

        A bare ``doit publish`` publishes every verified recipe and names the others in one line."""
        params = [
            {
                "name": "dest",
                "long": "dest",
                "type": str,
                "default": "",
                "help": "also copy bundle + archive to this folder",
            },
            {"name": "hub_repo", "long": "hub-repo", "type": str, "default": "", "help": "also push to this Hub repo"},
            {"name": "dry_run", "long": "dry-run", "type": bool, "default": False, "help": "only print the operations"},
            {
                "name": "sign",
                "long": "sign",
                "type": str,
                "default": "",
                "help": "sign the bundle with this PEM elliptic-curve private key (OpenSSF model-signing)",
            },
            {
                "name": "signing_cert",
                "long": "signing-cert",
                "type": str,
                "default": "",
                "help": "with --sign: the key's PEM certificate (certificate signing instead of a bare key)",
            },
            _CERT_CHAIN,
        ]
        for name in recipeset.buildable(session):
            yield {
                "name": name,
                "doc": f"publish {name} to dist/ (and --dest / --hub-repo)",
                "actions": [(_publish_action, [session, name])],
                "params": params,
                "uptodate": [False],
                "verbosity": 2,
            }

    def task_reproduce():
        """reproduce:<recipe> rebuilds into an empty temp cache and compares with dist/<recipe>/."""
        for name in recipeset.buildable(session):
            yield {
                "name": name,
                "doc": f"rebuild {name} from scratch and compare with its published bundle",
                "actions": [(_reproduce_action, [session, name])],
                "uptodate": [False],
                "verbosity": 2,
            }

    def task_check_bundle():
        """Recompute sha256 of every file of a bundle (--path: its folder or .tar.gz archive) against
        its manifest.json; verify its signature against --public-key or --cert-chain."""
        return {
            "actions": [_check_bundle_action],
            "uptodate": [False],
            "verbosity": 2,
            "params": [
                {
                    "name": "path",
                    "long": "path",
                    "type": str,
                    "default": "",
                    "help": "bundle folder, or its .tar.gz archive",
                },
                {
                    "name": "public_key",
                    "long": "public-key",
                    "type": str,
                    "default": "",
                    "help": "PEM public key the bundle's signature must verify against",
                },
                _CERT_CHAIN,
            ],
        }

    return {"task_publish": task_publish, "task_reproduce": task_reproduce, "task_check_bundle": task_check_bundle}
