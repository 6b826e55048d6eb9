"""Attention kernels that carry state: ``nn.Module``s whose ``forward`` has the kernel signature.

Letters: B batch, H heads, T query length, S key length, d head width, dv value width, k Linformer's
projected rows, m Performer's random features. Masks are bool, True = may attend (see
``attnmt.models.masks``).

``MultiHeadAttention`` holds such a module as its ``kernel``, so the kernel's parameters (Linformer's
projections E and F) and buffers (Performer's random features) are in the model's state_dict and travel
with its checkpoints; each layer builds its own. The plain functions beside them take that state as
keyword arguments and are what the tests compare with their twins: Linformer with k = S and E = F =
identity is ``math_attention``; Performer's routes are the explicit normalised phi(Q) phi(K)^T of
``kernels.linear_weights``, and its estimate approaches softmax attention as m grows.
``standalone_kernel`` gives any kernel by name, ready for one sequence length (benchmarks).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .dropout import dropout
from .kernels import KERNELS, Kernel, _as_4d, _causal_linear, _nonzero, linear_weights
from .masks import masked_softmax

# --------------------------------------------------------------------------- Linformer


def _key_padding(mask: torch.Tensor | None, kernel: str) -> torch.Tensor | None:
    """A key-padding mask as (b, h, 1, S), or ValueError for a per-query (T x S) one."""
    mask = _as_4d(mask)
    if mask is not None and mask.shape[-2] != 1:
        raise ValueError(
            f"{kernel} attention takes only a key-padding mask broadcastable to (B, 1, 1, S), "
            f"got shape {tuple(mask.shape)}; a per-query mask needs kernel 'math', 'sdpa' or 'sparse'"
        )
    return mask


def linformer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
    *,
    proj_k: torch.Tensor,
    proj_v: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linformer, Wang et al. 2020, eq. (7): softmax(Q (E K)^T / sqrt(d)) (F V).

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv); proj_k = E and proj_v = F, (k, max_len), of which
    the first S columns project the keys and values along the sequence to k rows (shared by the heads):
    O(T k + S k) time and memory instead of O(T S). mask: key padding only, broadcastable to (B, 1, 1, S);
    padded keys and values are zeroed before the projection, so they add nothing, and a projected row
    that gathers no real key (E[r, j] = 0 at every real j, as with E = identity) is masked like a padded
    key. A per-query mask, causal=True (every projected row mixes the whole sequence, future included)
    and S > max_len raise ValueError. dropout applies to P = softmax(...), (B, H, T, k).
    need_weights: the token weights the context is implicitly made of, context = (P F[:, :S]) V, so
    weights = P F[:, :S] (B, H, T, S), 0 at padded keys; with learned F they may be negative and need
    not sum to 1. Taken before dropout.
    """
    S, d = k.shape[-2], q.shape[-1]
    if causal:
        raise ValueError("linformer attention cannot be causal: each projected key mixes the whole "
                         "sequence, future positions included; use it for the encoder only")
    max_len = proj_k.shape[-1]
    if S > max_len:
        raise ValueError(f"linformer attention over {S} keys, but its projections cover max_len = "
                         f"{max_len} positions (model.max_positions in a Transformer)")
    mask = _key_padding(mask, "linformer")
    E = proj_k[:, :S].to(k.dtype)  # (k, S)
    F_ = proj_v[:, :S].to(v.dtype)  # (k, S)
    row_mask = None
    if mask is not None:
        keep = mask.transpose(-2, -1)  # (b, h, S, 1)
        k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
        row_mask = (mask.to(E.dtype) @ E.abs().transpose(0, 1)) > 0  # (b, h, 1, k)
    k_proj = E @ k  # (B, H, k, d)
    v_proj = F_ @ v  # (B, H, k, dv)
    scores = (q / math.sqrt(d)) @ k_proj.transpose(-2, -1)  # (B, H, T, k)
    if scores.dtype in (torch.bfloat16, torch.float16):  # under autocast: the softmax in fp32
        probs = masked_softmax(scores.float(), row_mask).to(scores.dtype)  # (B, H, T, k)
    else:
        probs = masked_softmax(scores, row_mask)  # (B, H, T, k)
    dropped = dropout(probs, dropout_p) if dropout_p > 0 else probs
    context = dropped @ v_proj  # (B, H, T, dv)
    if not need_weights:
        return context, None
    weights = probs @ F_  # (B, H, T, S)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # v was zeroed there: the context is still weights @ v
    return context, weights


class LinformerKernel(nn.Module):
    """Linformer attention (`linformer_attention`) with its projections E (proj_k) and F (proj_v),
    (k, max_len) parameters of the layer, shared by its heads (the paper's "headwise sharing");
    share_kv uses E for both ("key-value sharing"). Initialised N(0, 1/k), the random projection of the
    paper's Theorem 1 (sec. 4) under which softmax(Q (E K)^T) F V approximates attention (the authors'
    fairseq code starts from Xavier-uniform instead); then learned with the rest of the model."""

    def __init__(self, k: int, max_len: int, share_kv: bool = False):
        super().__init__()
        if k < 1 or max_len < 1:
            raise ValueError(f"linformer needs k >= 1 and max_len >= 1, got {k} and {max_len}")
        self.k, self.max_len = k, max_len
        self.proj_k = nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))
        if share_kv:
            self.register_parameter("proj_v", None)
        else:
            self.proj_v = nn.Parameter(torch.randn(k, max_len) / math.sqrt(k))

    def extra_repr(self) -> str:
        return f"k={self.k}, max_len={self.max_len}, share_kv={self.proj_v is None}"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        dropout_p: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        proj_v = self.proj_k if self.proj_v is None else self.proj_v
        return linformer_attention(q, k, v, mask, causal, need_weights, dropout_p,
                                   proj_k=self.proj_k, proj_v=proj_v)


# --------------------------------------------------------------------------- Performer


def orthogonal_features(m: int, d: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """m random feature vectors (m, d) for FAVOR+, Choromanski et al. 2021, sec. 2.4: blocks of d exactly
    orthogonal rows (the last block cut to size), each row rescaled to the norm of its own d-dimensional
    Gaussian vector (chi distributed), so that every row alone is distributed as N(0, I_d) and the
    estimator stays unbiased while the orthogonality lowers its variance.

    A block is Q^T from the QR decomposition of a d x d Gaussian matrix, with the columns of Q signed by
    diag(R) so that Q is uniform over the orthogonal group (Mezzadri 2007), not biased by the QR routine.
    Drawn with ``generator`` (the default one when None), in fp32.
    """
    blocks = []
    for _ in range(-(-m // d)):
        gaussian = torch.randn(d, d, generator=generator)
        Q, R = torch.linalg.qr(gaussian)  # (d, d) each
        signs = torch.sign(torch.diagonal(R))
        Q = Q * torch.where(signs == 0, torch.ones_like(signs), signs)  # (d, d), Haar-distributed
        blocks.append(Q.T)  # rows orthonormal
    directions = torch.cat(blocks)[:m]  # (m, d)
    norms = torch.randn(m, d, generator=generator).norm(dim=-1)  # (m,), chi with d degrees of freedom
    return directions * norms[:, None]  # (m, d)


def positive_feature_map(x: torch.Tensor, features: torch.Tensor, is_query: bool,
                         key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """phi+(x) = exp(w^T x' - |x'|^2 / 2) / sqrt(m) for each feature row w, x' = x / d^(1/4):
    Choromanski et al. 2021, Lemma 1, so that E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d)).

    x (..., L, d), features (m, d) -> (..., L, m), all > 0 (or 0 after underflow). Stabilised as in the
    authors' code: a constant is subtracted in the exponent before exp, which cancels in the ratio of
    attention's numerator and denominator: for queries the max of each row over its m features, for keys
    one max over all (real) keys and features of a (batch, head), since a constant per key would not
    cancel. key_mask (b, h, L, 1), True = real key: padded keys are left out of that max (and zeroed).
    The constant's gradient is zero in exact arithmetic, so it is detached. Caveat: keys far below the
    largest one underflow to 0 (in fp32 at about 87 below it), which a causal query that sees only
    those would feel; the authors' code shares it.
    """
    m, d = features.shape
    x = x * d**-0.25
    exponent = x @ features.transpose(0, 1) - (x * x).sum(dim=-1, keepdim=True) / 2  # (..., L, m)
    if is_query:
        stabiliser = exponent.amax(dim=-1, keepdim=True)  # (..., L, 1)
    else:
        real = exponent if key_mask is None else exponent.masked_fill(~key_mask, -math.inf)
        stabiliser = real.amax(dim=(-2, -1), keepdim=True)  # (..., 1, 1)
        stabiliser = torch.where(torch.isfinite(stabiliser), stabiliser, torch.zeros_like(stabiliser))
    phi = torch.exp(exponent - stabiliser.detach()) / math.sqrt(m)  # (..., L, m)
    if key_mask is not None:
        phi = phi.masked_fill(~key_mask, 0.0)
    return phi


def performer_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
    *,
    features: torch.Tensor,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Performer attention, FAVOR+ (Choromanski et al. 2021, sec. 2.2-2.4, with phi+ of Lemma 1): softmax
    attention estimated as D^-1 phi(Q) (phi(K)^T V), D = diag(phi(Q) phi(K)^T 1), in O(T m dv)
    time and O(T m + m dv) memory, no T x S matrix. `linear_attention` with `positive_feature_map` as phi.

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv); features (m, d), e.g. `orthogonal_features`.
    mask: key padding only, broadcastable to (B, 1, 1, S); a per-query mask raises ValueError. causal: the
    sums run over keys up to the query's end-aligned position (``kernels._causal_linear``, chunks of
    `chunk_size`, S > T for decoding after S - T cached keys). need_weights: the explicit normalised
    phi(Q) phi(K)^T (B, H, T, S) and the context from it, O(T S). dropout_p is ignored: there is no
    probability matrix to drop from. Half-precision inputs, and any input under autocast, are computed in
    fp32: an exponent rounded to bf16 is off by up to 2^-8 of its size, and exp turns that into a relative
    error. Rows with no key give zeros.
    """
    mask = _key_padding(mask, "performer")
    dtype = q.dtype
    if dtype in (torch.bfloat16, torch.float16):
        q, k, v = q.float(), k.float(), v.float()
    with torch.autocast(q.device.type, enabled=False):  # nor may autocast take the products back down
        return _performer(q, k, v, mask, causal, need_weights, features, chunk_size, dtype)


def _performer(q, k, v, mask, causal, need_weights, features, chunk_size, dtype):
    """`performer_attention` after its checks; the result cast to ``dtype``."""
    features = features.to(q.dtype)
    key_mask = None if mask is None else mask.transpose(-2, -1)  # (b, h, S, 1)
    phi_q = positive_feature_map(q, features, is_query=True)  # (B, H, T, m)
    phi_k = positive_feature_map(k, features, is_query=False, key_mask=key_mask)  # (B, H, S, m)
    if need_weights:
        weights = linear_weights(phi_q, phi_k, causal)  # (B, H, T, S)
        return (weights @ v).to(dtype), weights.to(dtype)
    if causal:
        return _causal_linear(phi_q, phi_k, v, chunk_size).to(dtype), None
    kv = phi_k.transpose(-2, -1) @ v  # (B, H, m, dv)
    z = phi_k.sum(dim=-2)  # (B, H, m)
    both = phi_q @ torch.cat([kv, z[..., None]], dim=-1)  # (B, H, T, dv + 1)
    return (both[..., :-1] / _nonzero(both[..., -1:])).to(dtype), None


class PerformerKernel(nn.Module):
    """Performer attention (`performer_attention`) with m = n_features positive orthogonal random
    features (`orthogonal_features`) for heads of width d_head, shared by the heads of the layer.

    The features are drawn once, here, and kept fixed: no redrawing during training (the paper redraws
    them periodically, which the authors found helps some tasks). They are a persistent buffer, so a
    saved model decodes the same after loading. seed: drawn from ``torch.Generator().manual_seed(seed)``,
    or from the default generator (like the weights' initialisation) when None.
    """

    def __init__(self, d_head: int, n_features: int, seed: int | None = 0, chunk_size: int = 64):
        super().__init__()
        if d_head < 1 or n_features < 1:
            raise ValueError(f"performer needs d_head >= 1 and n_features >= 1, got {d_head} and "
                             f"{n_features}")
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.chunk_size = chunk_size
        self.register_buffer("features", orthogonal_features(n_features, d_head, generator))  # (m, d)

    def extra_repr(self) -> str:
        m, d = self.features.shape
        return f"d_head={d}, n_features={m}"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        dropout_p: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return performer_attention(q, k, v, mask, causal, need_weights, dropout_p, features=self.features,
                                   chunk_size=self.chunk_size)


# --------------------------------------------------------------------------- by name

STANDALONE_KERNELS = ("math", "sdpa", "linear", "sparse", "linformer", "performer")
LINFORMER_ROWS, PERFORMER_FEATURES = 256, 256  # fixed, so that their cost grows as O(length)


def standalone_kernel(name: str, d_head: int, length: int,
                      device: torch.device | str | None = None) -> Kernel:
    """Any kernel of `STANDALONE_KERNELS` as a callable with the kernel signature, for sequences of up to
    `length` positions and heads of width d_head (benchmarks of time and memory against length).

    math, sdpa, linear and sparse are `KERNELS`' functions (sparse with its default window and stride,
    ceil(sqrt(S))); linformer is a `LinformerKernel` with k = 256 rows and max_len = length, performer a
    `PerformerKernel` with 256 features (seed 0), both on `device` and fixed in size, so that their cost
    grows linearly with the length.
    """
    if name not in STANDALONE_KERNELS:
        raise ValueError(f"unknown attention kernel {name!r}; valid: {', '.join(STANDALONE_KERNELS)}")
    if name in KERNELS:
        return KERNELS[name]
    if name == "linformer":
        return LinformerKernel(LINFORMER_ROWS, length).to(device)
    return PerformerKernel(d_head, PERFORMER_FEATURES, seed=0).to(device)
