"""Signing a bundle folder with OpenSSF model-signing (:func:`sign_bundle`) and checking a
signature (:func:`verify_signature`): a Sigstore bundle in ``<folder>/``:data:`SIGNATURE`,
with a PEM elliptic-curve key or its certificate; no network."""

from __future__ import annotations

import re
from pathlib import Path

from tasks.commands.publish.errors import PublishError

SIGNATURE = "npubuild.sig"  # the OpenSSF model-signing signature of a signed bundle (publish --sign)


def _hashing_config():
    from model_signing import hashing

    return hashing.Config().set_ignored_paths(paths=[SIGNATURE])


def check_signer(signing_cert, cert_chain) -> None:
    """Raise PublishError when a signing certificate comes without its CA chain: model-signing
    1.1.1 parses the chain and fails on none ("Unable to load PEM file ... MalformedFraming",
    which publish reported as the key file's problem), after the bundle was written."""
    if signing_cert and not cert_chain:
        raise PublishError(
            f"{signing_cert}: signing with a certificate needs the CA certificate(s) that issued it "
            f"(--cert-chain CA.pem), found none"
        )


def sign_bundle(
    folder: Path, private_key: str | Path, signing_cert: str | Path | None = None, cert_chain: list | None = None
) -> Path:
    """Sign every file of bundle ``folder`` (manifest.json included) with OpenSSF
    ``model-signing`` into ``<folder>/``:data:`SIGNATURE` (a Sigstore bundle, DSSE over the
    in-toto statement of each file's sha256), with a PEM elliptic-curve private key, or with
    that key's ``signing_cert`` and ``cert_chain`` (the CA certificates; required with a
    certificate). No network (no Sigstore Fulcio/Rekor).
    ECDSA signatures differ at each signing; the bundle's other files do not. Returns the
    signature's path. Raises PublishError naming the key file when signing fails, or the
    certificate when it comes without a chain."""
    from model_signing import signing

    check_signer(signing_cert, cert_chain)
    cfg = signing.Config().set_hashing_config(_hashing_config())
    try:
        if signing_cert:
            cfg.use_certificate_signer(
                private_key=private_key, signing_certificate=signing_cert, certificate_chain=cert_chain or []
            )
        else:
            cfg.use_elliptic_key_signer(private_key=private_key)
        cfg.sign(folder, folder / SIGNATURE)
    except Exception as e:
        raise PublishError(f"{private_key}: cannot sign {folder} with it ({type(e).__name__}: {e})") from None
    return folder / SIGNATURE


def verify_signature(
    folder: str | Path, public_key: str | Path | None = None, cert_chain: list | None = None
) -> list[str]:
    """Problems with bundle ``folder``'s signature (empty = it verifies): checked with
    ``model-signing`` against ``public_key`` (key-signed bundles) or ``cert_chain`` (PEM CA
    certificates, certificate-signed bundles); every file of the folder but the signature must
    be signed and unchanged, so a file changed together with its manifest entry fails. Without
    either, or without a signature, that is the problem reported."""
    from model_signing import verifying

    folder = Path(folder)
    sig = folder / SIGNATURE
    if not sig.exists():
        return [f"{SIGNATURE}: expected a signature (a key to check one was given), found none"]
    if not (public_key or cert_chain):
        return [
            f"{SIGNATURE}: expected --public-key or --cert-chain to check the signature against, found neither "
            f"(a signature anyone could have made proves nothing)"
        ]
    cfg = verifying.Config().set_hashing_config(_hashing_config())
    if public_key:
        cfg.use_elliptic_key_verifier(public_key=public_key)
    else:
        cfg.use_certificate_verifier(certificate_chain=cert_chain)
    try:
        cfg.verify(folder, sig)
    except Exception as e:
        # model_signing raises ValueError("Signature mismatch: [<diff lines>]"), the list's repr
        changed = sorted(set(re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", str(e))))
        why = (
            f"files changed since signing: {', '.join(changed)}"
            if changed
            else f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
        )
        return [f"{SIGNATURE}: does not verify against {public_key or ', '.join(map(str, cert_chain))}: {why}"]
    return []
