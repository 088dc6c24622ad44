"""Comparison metrics shared by every family's verify (and the LLM experiment script).

Plain numpy; no model code, so any module can import it without cycles.
"""

from __future__ import annotations

from tasks.proc import lazy

np = lazy.module("numpy")


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two flattened arrays; NaN if either holds NaN/inf (a NaN never passes a
    threshold: ``tasks.contract.common.checker``), 0.0 if either is all zeros."""
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    den = np.linalg.norm(a) * np.linalg.norm(b)
    if not np.isfinite(den):
        return float("nan")
    return float(a @ b / den) if den else 0.0


def agreement(ref: list[int], got: list[int]) -> tuple[float, int]:
    """(fraction of positions equal over len(ref), length of the common prefix)."""
    same = sum(1 for x, y in zip(ref, got) if x == y)
    pre = 0
    for x, y in zip(ref, got):
        if x != y:
            break
        pre += 1
    return same / max(1, len(ref)), pre


def perplexity(logits_rows: list[np.ndarray], targets: list[int]) -> float:
    """exp(mean negative log-likelihood) of ``targets`` under rows of logits [V] (float64 math)."""
    nll = []
    for lg, t in zip(logits_rows, targets):
        lg = lg.astype(np.float64).ravel()
        m = lg.max()
        nll.append(m + np.log(np.exp(lg - m).sum()) - lg[t])
    return float(np.exp(np.mean(nll)))
