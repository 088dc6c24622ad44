"""``doit publish:<recipe>`` (:func:`publish`): write a verified build's bundle,
``dist/<recipe>/``, and its archive, ``dist/<recipe>-<short key>.tar.gz`` (:mod:`.bundle`,
:mod:`.archive`), then copy both to ``dest`` (the bundle to ``<dest>/<recipe>/``, the archive to
``<dest>/``) and/or push the bundle to a Hub repo (:mod:`.hub`); ``sign`` signs the folder
(:mod:`.signing`). ``dry_run`` prints every operation and writes nothing at all (not even
``dist/``). It never builds: a recipe that is not ``verified`` is refused, saying why."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tasks.store import paths
from tasks.contract import family
from tasks.core.row import catalog_row, label
from tasks.core.session import Session
from tasks.core.status import RecipeStatus, catalog_recipes, recipe_status
from tasks.store.digest import sha256_file
from tasks.commands.publish.archive import write_archive, write_bundle
from tasks.commands.publish.bundle import (
    build_manifest,
    bundle_sources,
    json_bytes,
    merged_tools,
    sha256_bytes,
    shipped_digests,
    short_key,
)
from tasks.commands.publish.card import model_card
from tasks.commands.publish.check import file_count
from tasks.commands.publish.contents import shipped_files
from tasks.commands.publish.errors import PublishError
from tasks.commands.publish.hub import hub_operations, push_to_hub
from tasks.commands.publish.signing import SIGNATURE, check_signer, sign_bundle


def _verified_status(session: Session, recipe: str) -> RecipeStatus:
    """The catalog status of ``recipe``; raises PublishError unless it is ``verified`` or
    ``built-no-bars`` (built and measured, no bar to judge it: published as such, the card and
    the manifest say "built (no bars)", never "verified")."""
    recipes = catalog_recipes(session)
    if recipe not in recipes:
        raise PublishError(
            f"refusing to publish {recipe!r}: no such (non-abstract) recipe; known: {', '.join(recipes)}"
        )
    if recipes[recipe].source.shape:
        raise PublishError(
            f"refusing to publish {recipe}: it is a shape build (source.shape: random weights in the "
            f"model's configuration), built for time and memory, not a model to ship"
        )
    st = recipe_status(recipe, session)
    if st.state == "verify-failed":
        raise PublishError(f"refusing to publish {recipe}: its verify failed:\n  " + "\n  ".join(st.failures))
    if st.state == "stale" and "is damaged" in (st.reason or ""):  # an entry changed after it was built
        raise PublishError(
            f"refusing to publish {recipe}: a cache entry it ships is damaged ({st.reason}). "
            f"Run `doit cache_verify` (it moves damaged entries aside) and `doit build:{recipe}`."
        )
    if st.state == "stale":
        raise PublishError(
            f"refusing to publish {recipe}: its build is stale ({st.reason}); the recipe or a "
            f"tool changed since it was built. Run `doit build:{recipe}` first "
            f"(`doit explain:{recipe}` shows what changed)."
        )
    if st.state == "not-built":
        raise PublishError(
            f"refusing to publish {recipe}: it is not built ({st.reason}). Run `doit build:{recipe}` first."
        )
    return st


def refusal(recipe: str, session: Session) -> str | None:
    """Why ``recipe`` is not published, in a few words (its state: ``not-built``, ``stale``,
    ``verify-failed``, ``a shape build``...), None when it would be (:func:`_verified_status`
    passes): what a bare ``doit publish`` says of each recipe it passes over."""
    try:
        _verified_status(session, recipe)
    except PublishError:
        if catalog_recipes(session)[recipe].source.shape:
            return "a shape build"
        return recipe_status(recipe, session).state
    return None


def plan_bundle(recipe: str, session: Session | None = None) -> dict:
    """Everything publish writes, computed in memory (nothing written): the artifacts
    :func:`.contents.shipped_files` ships, the card, the manifest. Raises PublishError
    unless ``recipe`` is verified. Returns {"recipe", "short", "status", "files": {rel: Path
    (cache file) | bytes}, "manifest": dict, "folder": Path, "archive": Path, "mtime": int}.
    ``session``: the command's (default: a new one)."""
    session = session or Session()
    st = _verified_status(session, recipe)
    r = catalog_recipes(session)[recipe]
    row = catalog_row(recipe, r, st)
    short = short_key(st)
    sources = bundle_sources(st)
    loaded = shipped_files(sources, family(r.export.family))  # what its runtimes load; the rest stays in build/
    files: dict = {rel: sources[rel] for rel in loaded}
    sums = shipped_digests(session, st, files)
    card = model_card(r, row, short, loaded, files=dict(files), tools=merged_tools(st.entries))
    files["README.md"] = card.encode("utf-8")
    sums["README.md"] = (sha256_bytes(files["README.md"]), len(files["README.md"]))
    manifest = build_manifest(recipe, r, st, sums, row)
    files["manifest.json"] = json_bytes(manifest)
    dist = paths.dist_dir()
    return {
        "recipe": recipe,
        "short": short,
        "status": st,
        "files": dict(sorted(files.items())),
        "manifest": manifest,
        "folder": dist / recipe,
        "archive": dist / f"{recipe}-{short}.tar.gz",
        "mtime": manifest["archive_mtime"]["seconds"],
    }


def _print_ops(plan: dict, dest, hub_repo) -> None:
    total = sum(len(v) if isinstance(v, bytes) else v.stat().st_size for v in plan["files"].values())
    print(f"[dry-run] would write {plan['folder']}/ ({file_count(plan['manifest'])} files, {total / 1e6:.1f} MB):")
    for rel, v in plan["files"].items():
        size = len(v) if isinstance(v, bytes) else v.stat().st_size
        print(f"[dry-run]   {rel} ({size} bytes)")
    got = plan["manifest"]["archive_mtime"]["from"]
    print(
        f"[dry-run] would write {plan['archive']} (every entry's mtime {plan['mtime']}: "
        + ("the source has no commit time; SOURCE_DATE_EPOCH sets one)" if got == "unknown (0)" else f"{got})")
    )
    if dest:
        print(f"[dry-run] would copy {plan['folder'].name}/ and {plan['archive'].name} to {Path(dest).absolute()}/")
    if hub_repo:
        for op in hub_operations(plan, hub_repo):
            print(f"[dry-run] would call HfApi.{op[0]}({', '.join(f'{k}={v!r}' for k, v in op[1].items())})")


def _copy_to_dest(plan: dict, recipe: str, d: Path, sig: Path | None) -> None:
    """Copy the written bundle folder, archive and (``sig``) signature into ``d`` (made):
    under temp names first, renamed into place once all are copied, as ``dist/`` is written,
    so a full disk is one DiskFull line (naming ``--dest``) and leaves ``d``'s previous copy
    whole and nothing under the bundle's final name."""
    from tasks.store import outputs
    from tasks.store.fileops import folder_bytes

    names = [(plan["folder"], d / recipe), (plan["archive"], d / plan["archive"].name)]
    if sig is not None:
        names.append((sig, d / sig.name))
    temps = [(src, final.with_name(f".{final.name}.{os.getpid()}.new"), final) for src, final in names]
    need = sum(folder_bytes(src) if src.is_dir() else src.stat().st_size for src, _ in names)
    with outputs.full_disk_is(d, f"the bundle of {recipe}", "--dest", [t for _, t, _ in temps], need=need):
        d.mkdir(parents=True, exist_ok=True)
        for src, tmp, _ in temps:
            if src.is_dir():
                shutil.copytree(src, tmp)
            else:
                shutil.copyfile(src, tmp)
    for _, tmp, final in temps:
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        tmp.replace(final)


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _older_archives(dist: Path, recipe: str, current: Path) -> list[Path]:
    """Archives (and their ``.sig``) of ``recipe`` in ``dist`` from other builds:
    ``<recipe>-<12 hex>.tar.gz[.sig]`` other than ``current``. Left beside the new bundle they
    were a stale choice ``dist/`` offered (a new user's report); another recipe's archive never
    matches (the name is the recipe's, then exactly one short key)."""
    import re

    pat = re.compile(re.escape(recipe) + r"-[0-9a-f]{12}\.tar\.gz(\.sig)?")
    keep = {current.name, current.name + ".sig"}
    return sorted(p for p in dist.iterdir() if pat.fullmatch(p.name) and p.name not in keep and p.is_file())


def _keep_signature(folder: Path, new: Path, new_archive: Path, sign) -> bool:
    """Before the bundle ``new`` (written beside it) replaces ``folder``: a signature in
    ``folder`` is never dropped silently. Without ``sign``, a signed ``folder`` whose
    manifest.json and file names ``new`` repeats exactly (the same bytes: every file is in the
    manifest with its sha256) keeps its signature (copied into ``new``; True); one that differs
    is refused (PublishError, ``new`` and ``new_archive`` removed): sign the new bundle or
    delete the signature. False when there is nothing to keep (no signature, or ``sign``)."""
    old_sig = folder / SIGNATURE
    if sign or not old_sig.is_file():
        return False
    same = (
        (folder / "manifest.json").is_file()
        and (folder / "manifest.json").read_bytes() == (new / "manifest.json").read_bytes()
        and _files(folder) - {SIGNATURE} == _files(new)
    )
    if not same:
        shutil.rmtree(new, ignore_errors=True)
        new_archive.unlink(missing_ok=True)
        raise PublishError(
            f"refusing to replace {folder}/: it is signed ({SIGNATURE}) and this build's bundle differs "
            f"from the one signed; publish with --sign KEY.pem to sign the new one, or delete "
            f"{old_sig} to publish it unsigned"
        )
    shutil.copy2(old_sig, new / SIGNATURE)
    return True


def publish(
    recipe: str,
    dest: str | Path | None = None,
    hub_repo: str | None = None,
    dry_run: bool = False,
    endpoint: str | None = None,
    token: str | None = None,
    sign: str | Path | None = None,
    signing_cert: str | Path | None = None,
    cert_chain: list | None = None,
    session: Session | None = None,
) -> dict:
    """Publish a verified recipe: write ``dist/<recipe>/`` and ``dist/<recipe>-<short>.tar.gz``,
    then copy both to ``dest`` and/or push the bundle to Hub repo ``hub_repo``. With
    ``dry_run`` only print the operations. With ``sign`` (a PEM private key; with
    ``signing_cert`` and ``cert_chain`` for certificate signing) the folder is signed
    (:func:`sign_bundle`) after the archive is written, so the archive stays byte-reproducible;
    the signature is also written beside it as ``<archive>.sig`` (put it into the unpacked
    folder as :data:`SIGNATURE` to check it). Without ``sign``, a signed bundle already there
    keeps its signature when the new one is the same, file for file, and is refused otherwise
    (:func:`_keep_signature`): a signature is never dropped silently. Returns {"folder", "archive", "short",
    "signature"?, "hub"?}. Raises PublishError (not verified, stale, not built; a cache file
    that does not match its entry's manifest; signing failed; a failed target). ``session``:
    the command's (default: a new one)."""
    if sign:
        check_signer(signing_cert, cert_chain)  # before anything is written
    plan = plan_bundle(recipe, session)
    if dry_run:
        _print_ops(plan, dest, hub_repo)
        if sign:
            print(f"[dry-run] would sign {plan['folder']}/ with {sign} into {SIGNATURE} and {plan['archive'].name}.sig")
        return {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"], "dry_run": True}
    from tasks.store import outputs

    # the folder and the archive are written under temp names, then renamed into place together:
    # a full disk is one DiskFull line and leaves the previous bundle and archive whole
    folder, dist = plan["folder"], plan["folder"].parent
    tmp_folder, tmp_archive = folder.with_name(f".{folder.name}.tmp"), dist / f".{plan['archive'].name}.new"
    with outputs.full_disk_is(dist, f"the bundle of {recipe}", "NPUBUILD_DIST", [tmp_folder, tmp_archive]):
        dist.mkdir(parents=True, exist_ok=True)
        write_bundle(plan, tmp_folder)
        write_archive(tmp_folder, tmp_archive, recipe, plan["mtime"])
    kept = _keep_signature(folder, tmp_folder, tmp_archive, sign)
    if folder.exists():
        shutil.rmtree(folder)
    tmp_folder.replace(folder)
    tmp_archive.replace(plan["archive"])
    for old in _older_archives(dist, recipe, plan["archive"]):  # the folder is the new archive's alone
        old.unlink(missing_ok=True)
        print(f"[publish:{recipe}] removed {old.name}: an earlier build's archive, not the bundle in {folder.name}/")
    print(
        f"[publish:{recipe}] {plan['folder']} ({file_count(plan['manifest'])} files) and {plan['archive']} "
        f"(sha256 {sha256_file(plan['archive'])[:16]}...)"
    )
    if plan["status"].state != "verified":
        print(
            f"[publish:{recipe}] {label(plan['status'].state)}: verify measured it, no bar judged it (the recipe "
            f"sets no verify.thresholds); its card and manifest say so"
        )
    out = {"folder": plan["folder"], "archive": plan["archive"], "short": plan["short"]}
    sig_copy = plan["archive"].with_name(plan["archive"].name + ".sig")
    if kept:
        print(
            f"[publish:{recipe}] kept its signature {folder / SIGNATURE}: the bundle is the one it signed, file "
            "for file"
        )
        out["signature"] = folder / SIGNATURE
    else:
        sig_copy.unlink(missing_ok=True)
    if sign:
        out["signature"] = sign_bundle(plan["folder"], sign, signing_cert, cert_chain)
        shutil.copyfile(out["signature"], sig_copy)
        print(f"[publish:{recipe}] signed with {sign}: {out['signature']} and {sig_copy}")
    if dest:
        d = Path(dest).absolute()
        _copy_to_dest(plan, recipe, d, sig_copy if sign else None)
        print(f"[publish:{recipe}] copied to {d}/")
        out["dest"] = d
    if hub_repo:
        out["hub"] = push_to_hub(plan, hub_repo, endpoint=endpoint, token=token)
    return out
