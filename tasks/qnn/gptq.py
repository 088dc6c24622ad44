"""GPTQ's arithmetic (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers", 2022, Algorithm 1; reference code github.com/IST-DASLab/gptq
``gptq.py`` ``fasterquant``), in torch on the CPU: the inverse-Hessian factor of one MatMul
input and the codes of every weight that reads that input. :mod:`tasks.qnn.weights` encodes the
result; :mod:`tasks.qnn.seqgptq` gathers the Hessians one MatMul input at a time.

Precision: float32 throughout (Hessian sums, damping, factor, updates). Measured against
float64 on the same Hessians (benchmarks/README.md, "Sequential GPTQ"; ``tests/qnn/test_gptq_seq.py``
keeps a correlated-input case): on tiny-qwen2's real layer inputs (29 int4 weights, LPBQ 32)
99.9998 % of the codes are equal (99.9932 % for the worst weight) and the layer error
tr(E^T H E) is 1.000000-1.000161 x float64's; held-out logits cosine of the whole model equal
to 5 digits. float32 halves the memory (Qwen2.5-7B's down_proj Hessian 18944 x 18944: 1.34 GiB
instead of 2.67 GiB).
"""

from __future__ import annotations

from tasks.proc import lazy

np = lazy.module("numpy")
torch = lazy.module("torch")

#: damping, as a fraction of mean(diag H) added to the diagonal (tasks.qnn.weights.GPTQ_DAMP)
GPTQ_DAMP = 0.1


def inverse_factor(H, damp: float = GPTQ_DAMP, dtype: str = "float32", inplace: bool = False):
    """``(U, dead)`` for an input Hessian H [K, K] (numpy or torch, any float dtype; X^T X / n):
    U [K, K] torch ``dtype``, the upper Cholesky factor of (H' + damp x mean(diag H') x I)^-1,
    where H' is H with the diagonal of dead inputs (diag 0: a column that never varies) set to 1,
    and ``dead`` bool [K] (their weights are zeroed before rounding, as the reference does).

    The reference code takes Cholesky, ``cholesky_inverse`` and Cholesky again (4/3 K^3
    multiply-adds); here, with J the order reversal, J H J = M M^T (Cholesky, K^3/3) and
    U = J M^-1 J (a triangular inverse, K^3/3: :func:`_lower_inverse`), the same factor (the
    upper Cholesky factor with a positive diagonal is unique) in half the work: for Qwen2.5-7B's
    down_proj (K = 18944) that is ~4.5 T multiply-adds instead of ~9. Memory: H (or its copy
    when not ``inplace``) plus one K x K copy and a (K/2)^2 temporary. Raises torch's
    ``LinAlgError`` when H is not positive definite after damping (it always is for damp > 0
    and a finite H)."""
    t = getattr(torch, dtype)
    H = torch.as_tensor(np.asarray(H) if not isinstance(H, torch.Tensor) else H).to(t)
    dead = (torch.diagonal(H) == 0).numpy().copy()
    R = torch.flip(H, (0, 1))  # a copy: J H J
    del H
    d = torch.diagonal(R)
    d[torch.as_tensor(dead[::-1].copy())] = 1
    d += damp * torch.mean(d)
    torch.linalg.cholesky(R, out=R)
    _lower_inverse(R)
    return torch.flip(R, (0, 1)), dead


def _lower_inverse(M, leaf: int = 256) -> None:
    """Invert the lower-triangular M [n, n] (a torch view) in place: the blocks' inverses by
    recursion, then the off-diagonal block -C^-1 B A^-1 (two GEMMs), K^3/3 multiply-adds as
    LAPACK's ``trtri`` (which torch does not expose); leaves of ``leaf`` rows by
    ``solve_triangular``."""
    n = M.shape[0]
    if n <= leaf:
        M.copy_(torch.linalg.solve_triangular(M, torch.eye(n, dtype=M.dtype), upper=False))
        return
    h = n // 2
    A, B, C = M[:h, :h], M[h:, :h], M[h:, h:]
    _lower_inverse(A, leaf)
    _lower_inverse(C, leaf)
    B.copy_(C @ (B @ A)).neg_()


#: :func:`spans` rounds its blocks' widths to this; ``quantize.gptq_span`` is checked to be a
#: multiple of it at load (tasks/contract/params.py, which keeps the literal: a test checks they agree)
SPAN_ALIGN = 32


def spans(K: int, span: int | None, align: int = SPAN_ALIGN) -> list[tuple[int, int]]:
    """The diagonal blocks ``[(k0, k1)]`` GPTQ's Hessian of an input of K features is cut into
    with ``quantize.gptq_span`` ``span`` (a multiple of ``align``; None, or K <= span: one
    block, the whole Hessian): ceil(K / span) blocks of equal width rounded up to a multiple of
    ``align`` (the last takes the rest), none wider than ``span``. Qwen2.5-7B's down_proj
    input (18944) with span 4736: four blocks of 4736."""
    if not span or K <= span:
        return [(0, K)]
    per = -(-K // -(-K // span))  # ceil(K / the number of blocks)
    w = -(-per // align) * align
    return [(k0, min(K, k0 + w)) for k0 in range(0, K, w)]


def block_factors(blocks: list, damp: float = GPTQ_DAMP, dtype: str = "float32", rows: int = 1):
    """``(U, dead)`` of a Hessian given as its diagonal blocks ``[(k0, H_b)]`` (sums X^T X
    of the rows of :func:`spans`, divided here by ``rows``, in place): U is
    :func:`inverse_factor`'s for a single block, else ``[(k0, U_b)]`` as :func:`codes` takes
    it; ``dead`` bool [K], the blocks' in order. The list is emptied as it goes, so each
    block's memory can go once it is factored."""
    U, dead = [], []
    while blocks:
        k0, h = blocks.pop(0)
        h /= max(rows, 1)
        Ub, db = inverse_factor(h, damp, dtype, inplace=True)
        del h
        U.append((k0, Ub))
        dead.append(db)
    return (U[0][1] if len(U) == 1 else U), np.concatenate(dead)


def codes(
    W, U, dead, S, qmin: int = -8, qmax: int = 7, step: int = 16, block: int = 256, chunk_bytes: int = 256 * 2**20
):
    """GPTQ codes int8 [K, N] in [qmin, qmax] for weight W [K, N] (float, a MatMul's constant
    input: K in-features) with fixed scales S (broadcastable to [K, N]) and ``(U, dead)`` of its
    input from :func:`inverse_factor` (U's dtype is the arithmetic's); U may also be
    ``[(k0, U_b)]``, the factors of the Hessian's diagonal blocks (rows k0.. of each, their
    widths U_b's; :func:`tasks.qnn.seqgptq.sequential` with a span): each block of rows is then
    rounded on its own (a row's error is carried to the later rows of its block only).

    The updates are the paper's "lazy batch" on two levels (the result is Algorithm 1's up to
    float rounding: ``tests/qnn/test_gptq_seq.py`` compares it with the row-by-row algorithm in
    float64): within ``step`` rows each row's error goes to the next rows at once (rank-1
    updates, ``step``/2 x N elements a row), a ``step``'s errors go to the rest of its ``block``
    of rows in one product, and a ``block``'s to every later row in one product (the paper has
    one level, a lazy batch of 128 rows). One level of 32 rows wrote the rest of W once per 32
    rows, bound by memory: a Qwen2.5-7B gate_proj (3584 x 18944) took 2.35-2.58 s of codes on
    this 2-core machine, 1.41-1.96 s with ``step`` 16 and ``block`` 256 (the fastest of the
    pairs of 8/16/32 x 128/256/512 measured; down_proj's 4736-row blocks 0.77 -> 0.61 s;
    benchmarks/README.md, "GPTQ's updates on two levels"). Output channels are independent
    given U, so they are done at most ``chunk_bytes`` of W at a time, in chunks of equal width
    (memory: the codes plus ~3 chunks, whatever N)."""
    if isinstance(U, list):
        Q = np.empty(np.shape(W), np.int8)
        S = np.broadcast_to(S, Q.shape)
        for k0, Ub in U:
            k1 = k0 + Ub.shape[0]
            Q[k0:k1] = codes(W[k0:k1], Ub, dead[k0:k1], S[k0:k1], qmin, qmax, step, block, chunk_bytes)
        return Q
    Q = np.empty(np.shape(W), np.int8)
    K, N = Q.shape
    cols = max(64, chunk_bytes // (4 * K))
    cols = -(-N // -(-N // cols))  # equal chunks: each costs a pass of K rows, however narrow
    S = np.broadcast_to(S, (K, N))
    for n0 in range(0, N, cols):
        n1 = min(N, n0 + cols)
        Q[:, n0:n1] = _codes(W[:, n0:n1], U, dead, S[:, n0:n1], qmin, qmax, step, block)
    return Q


def _codes(W, U, dead, S, qmin, qmax, step, block):
    t = U.dtype
    W = torch.as_tensor(np.array(W, np.float32)).to(t)  # [K, n]: row k = in-feature k, contiguous
    S = torch.as_tensor(np.array(S, np.float32)).to(t)
    W[torch.as_tensor(dead)] = 0
    K, N = W.shape
    block = max(block, step)
    Q = torch.empty((K, N), dtype=torch.int8)
    q = torch.empty(N, dtype=t)
    E = torch.empty((block, N), dtype=t)  # the errors of the current block's rows, scaled by U's diagonal
    for b0 in range(0, K, block):
        b1 = min(b0 + block, K)
        for c0 in range(b0, b1, step):
            c1 = min(c0 + step, b1)
            Wb = W[c0:c1]
            for j in range(c1 - c0):
                w, s, e = Wb[j], S[c0 + j], E[c0 - b0 + j]
                torch.div(w, s, out=q).round_().clamp_(qmin, qmax)
                Q[c0 + j] = q
                torch.sub(w, q.mul_(s), out=e).div_(U[c0 + j, c0 + j])
                if j + 1 < c1 - c0:
                    Wb[j + 1 :].addr_(U[c0 + j, c0 + j + 1 : c1], e, alpha=-1)
            if c1 < b1:
                W[c1:b1].addmm_(U[c0:c1, c1:b1].T, E[c0 - b0 : c1 - b0], alpha=-1)
        if b1 < K:
            W[b1:].addmm_(U[b0:b1, b1:].T, E[: b1 - b0], alpha=-1)
    return Q.numpy()


def gptq(W, H, S, damp: float = GPTQ_DAMP, qmin: int = -8, qmax: int = 7, dtype: str = "float32", **lazy):
    """GPTQ codes int8 [K, N] for one weight W [K, N] with scales S and input Hessian H [K, K]:
    :func:`inverse_factor` then :func:`codes` (``lazy``: its ``step`` and ``block``)."""
    U, dead = inverse_factor(H, damp, dtype)
    return codes(W, U, dead, S, qmin, qmax, **lazy)
