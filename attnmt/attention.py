"""Attention: score functions for an RNN decoder, attention kernels, multi-head attention.

Letters: B batch, H heads, T query length, S key length, d head width, D model
width, A additive-attention width, N blocks of queries, C / W block width.
Masks are bool, True = may attend (see `attnmt.masks`).

Two registries, both plain dicts:
  SCORES  name -> score module for single-query attention (`Attention`);
  KERNELS name -> kernel(q, k, v, mask, causal, need_weights, dropout_p)
          -> (context (B, H, T, d), weights (B, H, T, S) or None).
Every fast kernel has a plain twin that the tests compare it with: `math` for
`sdpa`, the explicit normalised phi(Q) phi(K)^T for `linear`, and `math` under
`sparse_pattern` for `sparse`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from attnmt.linear import Linear, stacked
from attnmt.masks import causal_mask, combine_masks, masked_softmax, normalise_mask

# --------------------------------------------------------------------------- scores


class AdditiveScore(nn.Module):
    """Bahdanau et al. 2015, App. A.1.2: score(q, k) = v^T tanh(W_q q + W_k k)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_proj = Linear(query_dim, attn_dim, bias=False)
        self.key_proj = Linear(key_dim, attn_dim)
        self.v = Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> W_k k (B, S, A)."""
        return self.key_proj(keys)

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, Dq), proj_keys (B, S, A) -> scores (B, T, S)."""
        q = self.query_proj(query)  # (B, T, A)
        hidden = torch.tanh(q[:, :, None, :] + proj_keys[:, None, :, :])  # (B, T, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


class DotScore(nn.Module):
    """Luong et al. 2015, eq. (8) "dot": score(q, k) = q^T k. No parameters."""

    scaled = False

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        if query_dim != key_dim:
            name = "scaled_dot" if self.scaled else "dot"
            raise ValueError(
                f"attention score {name!r} needs query_dim == key_dim, got {query_dim} and {key_dim}; "
                "use 'general' or 'additive' for different sizes"
            )
        self.dim = key_dim

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Identity: keys (B, S, Dk)."""
        return keys

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, D), proj_keys (B, S, D) -> scores (B, T, S)."""
        scores = query @ proj_keys.transpose(1, 2)  # (B, T, S)
        return scores / math.sqrt(self.dim) if self.scaled else scores


class ScaledDotScore(DotScore):
    """Vaswani et al. 2017, eq. (1): score(q, k) = q^T k / sqrt(d)."""

    scaled = True


class GeneralScore(nn.Module):
    """Luong et al. 2015, eq. (8) "general": score(q, k) = q^T W k, W of shape (Dq, Dk)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.key_proj = Linear(key_dim, query_dim, bias=False)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> W k (B, S, Dq)."""
        return self.key_proj(keys)

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, Dq), proj_keys (B, S, Dq) -> scores (B, T, S)."""
        return query @ proj_keys.transpose(1, 2)  # (B, T, S)


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore,
    "dot": DotScore,
    "general": GeneralScore,
    "scaled_dot": ScaledDotScore,
}


class Attention(nn.Module):
    """Single-head attention for an RNN decoder, with a score from `SCORES`.

    Keys are projected once per sentence (`project_keys`); each decoder step
    then calls `forward` with its query. `attn_dim` is used by `additive` only.
    """

    def __init__(self, score: str, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"unknown attention score {score!r}; valid: {', '.join(SCORES)}")
        self.score = SCORES[score](query_dim, key_dim, attn_dim)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> projected keys (B, S, *): W_k k, W k, or keys itself."""
        return self.score.project_keys(keys)

    def forward(
        self,
        query: torch.Tensor,
        proj_keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Dq) or (B, T, Dq), proj_keys from `project_keys`, values (B, S, Dv),
        mask (B, S) bool or None -> (context (B, [T,] Dv), weights (B, [T,] S))."""
        single = query.dim() == 2
        if single:
            query = query[:, None, :]  # (B, 1, Dq)
        scores = self.score(query, proj_keys)  # (B, T, S)
        weights = masked_softmax(scores, None if mask is None else mask[:, None, :])  # (B, T, S)
        context = weights @ values  # (B, T, Dv)
        if single:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights


# --------------------------------------------------------------------------- kernels


def _as_4d(mask: torch.Tensor | None) -> torch.Tensor | None:
    """Prepend size-1 dims so a broadcastable mask has 4 dims (b, h, t, S)."""
    if mask is None or mask.dim() == 4:
        return mask
    return mask[(None,) * (4 - mask.dim())]


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d)) V, Vaswani et al. 2017 eq. (1), written out: the reference kernel.

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv); mask bool broadcastable to
    (B, H, T, S) or None; causal adds `causal_mask(T, S=S)` (end-aligned).
    Returns (context (B, H, T, dv), weights (B, H, T, S)); the weights are always
    returned (they exist anyway) and are taken before dropout. O(T S) memory.
    """
    T, S = q.shape[-2], k.shape[-2]
    if causal:
        mask = combine_masks(mask, causal_mask(T, q.device, S))
    # Scale q rather than the scores: one (T, S) temporary fewer.
    scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-2, -1)  # (B, H, T, S)
    weights = masked_softmax(scores, mask)  # (B, H, T, S)
    probs = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return probs @ v, weights  # (B, H, T, dv)


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`F.scaled_dot_product_attention` (fused, O(T d) extra memory): the default kernel.

    Same arguments and result as `math_attention`, but returns no weights; with
    need_weights it runs `math_attention` instead. Rows with no key to attend to
    give zeros (SDPA alone gives NaN).
    """
    if need_weights:
        return math_attention(q, k, v, mask, causal, need_weights, dropout_p)
    T, S = q.shape[-2], k.shape[-2]
    if mask is None and (not causal or T == S):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal), None
    if causal:
        # is_causal aligns to the top-left corner; decoding with a cache needs the
        # end-aligned mask, and a padding mask must be combined with it anyway.
        mask = combine_masks(mask, causal_mask(T, q.device, S))
    mask = _as_4d(mask)
    empty = ~mask.any(dim=-1, keepdim=True)  # (b, h, t, 1)
    # SDPA turns a row with no key into NaN, in the output and in the gradients.
    # Let such rows see key 0, then zero their output: the fill stops their
    # gradient too, so key 0 gets nothing from them.
    first_key = torch.arange(S, device=q.device) == 0  # (S,)
    safe_mask = mask | (empty & first_key)  # (b, h, t, S)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=safe_mask, dropout_p=dropout_p)
    return context.masked_fill(empty, 0.0), None  # (B, H, T, dv)


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 > 0, Katharopoulos et al. 2020 eq. (7)."""
    # In place: saves a tensor, and elu's backward needs its input, not its output.
    return F.elu(x).add_(1)


def _nonzero(den: torch.Tensor) -> torch.Tensor:
    """Replace 0 denominators (rows that see no key, whose numerator is 0 too) by 1.

    `where` rather than `+ eps`: results stay exact, and no 1/0 reaches autograd.
    """
    return torch.where(den > 0, den, torch.ones_like(den))


def linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear attention, Katharopoulos et al. 2020 "Transformers are RNNs", eqs. (4)-(7).

    V'_i = phi(Q_i)^T (sum_j phi(K_j) V_j^T) / (phi(Q_i)^T sum_j phi(K_j)), with
    phi = `elu_feature_map`: O(T d^2) time, O(T d + d^2) memory, no T x S matrix.

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv). mask: key padding only,
    broadcastable to (B, 1, 1, S) (or (B, H, 1, S)); padded keys drop out of both
    sums. A per-query (T x S) mask raises ValueError: it would need the matrix.
    causal: the sums run over keys up to the query's end-aligned position (eq. (9)),
    computed in chunks of `chunk_size` queries: exact C x C products inside a
    chunk plus a running state from the chunks before, O(T d + T d^2 / C) memory.
    need_weights: builds the explicit normalised phi(Q) phi(K)^T matrix (B, H, T, S)
    and the context from it, O(T S): for tiny debugging inputs only.
    dropout_p is ignored: there is no probability matrix to drop from.
    Rows with no key give zeros.
    """
    if mask is not None:
        mask = _as_4d(mask)
        if mask.shape[-2] != 1:
            raise ValueError(
                f"linear attention takes only a key-padding mask broadcastable to (B, 1, 1, S), "
                f"got shape {tuple(mask.shape)}; a per-query mask needs kernel 'math', 'sdpa' or 'sparse'"
            )
    phi_q = elu_feature_map(q)  # (B, H, T, d)
    phi_k = elu_feature_map(k)  # (B, H, S, d)
    if mask is not None:
        phi_k = phi_k.masked_fill(~mask.transpose(-2, -1), 0.0)  # (B, H, S, d)
    if need_weights:
        weights = linear_weights(phi_q, phi_k, causal)  # (B, H, T, S)
        return weights @ v, weights
    if causal:
        return _causal_linear(phi_q, phi_k, v, chunk_size), None
    kv = phi_k.transpose(-2, -1) @ v  # (B, H, d, dv)
    z = phi_k.sum(dim=-2)  # (B, H, d)
    # Numerator and denominator in one matmul: z rides along as an extra column of kv.
    both = phi_q @ torch.cat([kv, z[..., None]], dim=-1)  # (B, H, T, dv + 1)
    return both[..., :-1] / _nonzero(both[..., -1:]), None


def linear_weights(phi_q: torch.Tensor, phi_k: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The matrix linear attention applies implicitly: phi(Q) phi(K)^T, rows normalised.

    phi_q (B, H, T, d), phi_k (B, H, S, d) already masked -> (B, H, T, S). O(T S).
    """
    T, S = phi_q.shape[-2], phi_k.shape[-2]
    similarity = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    if causal:
        similarity = similarity.masked_fill(~causal_mask(T, phi_q.device, S), 0.0)
    return similarity / _nonzero(similarity.sum(dim=-1, keepdim=True))


def _causal_linear(
    phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Causal linear attention, end-aligned; phi_q (..., T, d), phi_k (..., S, d), v (..., S, dv)."""
    T, S = phi_q.shape[-2], phi_k.shape[-2]
    lead, dv = phi_q.shape[:-2], v.shape[-1]
    if T > S:
        # The first T - S queries come before every key and see nothing.
        seen = _causal_linear(phi_q[..., T - S :, :], phi_k, v, chunk_size)  # (..., S, dv)
        return torch.cat([seen.new_zeros(*lead, T - S, dv), seen], dim=-2)  # (..., T, dv)
    # Keys before the first query (a decoding cache) are seen by every query.
    prefix = S - T
    kv_prefix = phi_k[..., :prefix, :].transpose(-2, -1) @ v[..., :prefix, :]  # (..., d, dv)
    z_prefix = phi_k[..., :prefix, :].sum(dim=-2)  # (..., d)
    phi_k, v = phi_k[..., prefix:, :], v[..., prefix:, :]  # (..., T, d), (..., T, dv)

    C = max(1, min(chunk_size, T))
    N = -(-T // C)
    pad = N * C - T
    # Zero padding: padded keys add nothing, padded queries are cut off below.
    q_chunks = F.pad(phi_q, (0, 0, 0, pad)).unflatten(-2, (N, C))  # (..., N, C, d)
    k_chunks = F.pad(phi_k, (0, 0, 0, pad)).unflatten(-2, (N, C))  # (..., N, C, d)
    v_chunks = F.pad(v, (0, 0, 0, pad)).unflatten(-2, (N, C))  # (..., N, C, dv)

    # State each chunk starts from (eq. (9)-(10) summed a chunk at a time): an
    # exclusive prefix sum over chunks, N d^2 values instead of T d^2.
    kv_chunk = k_chunks.transpose(-2, -1) @ v_chunks  # (..., N, d, dv)
    z_chunk = k_chunks.sum(dim=-2)  # (..., N, d)
    kv_before = torch.cat([torch.zeros_like(kv_chunk[..., :1, :, :]), kv_chunk[..., :-1, :, :]], dim=-3)
    kv_before = kv_prefix.unsqueeze(-3) + kv_before.cumsum(dim=-3)  # (..., N, d, dv)
    z_before = torch.cat([torch.zeros_like(z_chunk[..., :1, :]), z_chunk[..., :-1, :]], dim=-2)
    z_before = z_prefix.unsqueeze(-2) + z_before.cumsum(dim=-2)  # (..., N, d)

    # Inside a chunk: the explicit causal C x C products.
    within = q_chunks @ k_chunks.transpose(-2, -1)  # (..., N, C, C)
    within = within.masked_fill(~causal_mask(C, phi_q.device), 0.0)
    numerator = within @ v_chunks + q_chunks @ kv_before  # (..., N, C, dv)
    denominator = within.sum(dim=-1, keepdim=True) + q_chunks @ z_before[..., None]  # (..., N, C, 1)
    context = (numerator / _nonzero(denominator)).flatten(-3, -2)  # (..., N C, dv)
    return context[..., :T, :]  # (..., T, dv)


def sparse_pattern(
    T: int,
    S: int,
    window: int,
    stride: int,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Which keys each query may see under `sparse_attention`: (T, S) bool, the reference.

    Query i sits at key position p: p = i when not causal (so padding keys on
    the right changes nothing), p = i + S - T when causal (end-aligned like
    `causal_mask`, for decoding after S - T cached keys). It sees key j when
      local:   |p - j| < window               (causal: 0 <= p - j < window), or
      summary: j % stride == stride - 1       (causal: and j <= p).
    The summary columns are the "fixed" pattern of Child et al. 2019, sec. 4.3,
    with c = 1: every query reads the last key of each stride-long block.
    """
    query_pos = torch.arange(T, device=device)[:, None] + (S - T if causal else 0)  # (T, 1)
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    offset = query_pos - key_pos  # (T, S)
    summary = key_pos % stride == stride - 1  # (1, S)
    if causal:
        return ((offset >= 0) & (offset < window)) | (summary & (offset >= 0))
    return (offset.abs() < window) | summary


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    need_weights: bool = False,
    dropout_p: float = 0.0,
    *,
    window: int | None = None,
    stride: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sparse attention, Child et al. 2019: softmax only over `sparse_pattern` & mask.

    q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv); mask bool broadcastable to
    (B, H, T, S) or None. window and stride default to ceil(sqrt(S)); fix them
    with `functools.partial(sparse_attention, window=64, stride=64)`.

    No T x S score matrix: queries go in blocks of `window`; each block gathers
    the ~3 window keys its local band can reach, and all queries share the
    S / stride summary keys. A summary key inside a query's band is dropped from
    the summary part so it is counted once. Memory O(T (window + S / stride)),
    plus the mask itself when it is a per-query (T x S) one.
    need_weights: runs `math_attention` under the dense pattern instead (O(T S)).
    Returns (context (B, H, T, dv), None).
    """
    T, S, d = q.shape[-2], k.shape[-2], q.shape[-1]
    window = window if window is not None else max(1, math.ceil(math.sqrt(S)))
    stride = stride if stride is not None else max(1, math.ceil(math.sqrt(S)))
    if window < 1 or stride < 1:
        raise ValueError(f"sparse attention needs window >= 1 and stride >= 1, got {window} and {stride}")
    if need_weights:
        pattern = sparse_pattern(T, S, window, stride, causal, q.device)
        return math_attention(q, k, v, combine_masks(mask, pattern), False, True, dropout_p)
    device = q.device
    W, offset = window, (S - T if causal else 0)  # query i sits at key position i + offset
    N = -(-T // W)
    query_pos = (torch.arange(N * W, device=device) + offset).view(N, W)  # (N, W)

    # Local band: query block n holds positions n W + offset + [0, W), so it can
    # reach keys from n W + offset - W + 1 on, L of them.
    L = 2 * W - 1 if causal else 3 * W - 2
    key_idx = (torch.arange(N, device=device) * W + offset - W + 1)[:, None] + torch.arange(L, device=device)
    band_offset = query_pos[:, :, None] - key_idx[:, None, :]  # (N, W, L)
    if causal:
        band_ok = (band_offset >= 0) & (band_offset < W)
    else:
        band_ok = band_offset.abs() < W
    band_ok = band_ok & ((key_idx >= 0) & (key_idx < S))[:, None, :]  # (N, W, L)
    gather_idx = key_idx.clamp(0, S - 1).flatten()  # (N L,)
    k_band = k.index_select(-2, gather_idx).unflatten(-2, (N, L))  # (B, H, N, L, d)
    v_band = v.index_select(-2, gather_idx).unflatten(-2, (N, L))  # (B, H, N, L, dv)

    # Summary columns, shared by every query; keep only those outside the band.
    summary_idx = torch.arange(stride - 1, S, stride, device=device)  # (M,)
    M = summary_idx.numel()
    k_summary = k.index_select(-2, summary_idx)  # (B, H, M, d)
    v_summary = v.index_select(-2, summary_idx)  # (B, H, M, dv)
    summary_offset = query_pos[:, :, None] - summary_idx  # (N, W, M)
    summary_ok = summary_offset >= W if causal else summary_offset.abs() >= W

    if mask is not None:
        band_mask, summary_mask = _sparse_mask(_as_4d(mask), gather_idx, summary_idx, N, W, L)
        band_ok = band_ok & band_mask  # (b, h, N, W, L)
        summary_ok = summary_ok & summary_mask  # (b, h, N, W, M)

    scale = 1 / math.sqrt(d)
    q_blocks = F.pad(q, (0, 0, 0, N * W - T)).unflatten(-2, (N, W))  # (B, H, N, W, d)
    band_scores = q_blocks @ k_band.transpose(-2, -1) * scale  # (B, H, N, W, L)
    summary_scores = q_blocks @ k_summary.transpose(-2, -1).unsqueeze(-3) * scale  # (B, H, N, W, M)
    scores = torch.cat([band_scores, summary_scores], dim=-1)  # (B, H, N, W, L + M)
    shape = torch.broadcast_shapes(band_ok.shape[:-1], summary_ok.shape[:-1])
    allowed = torch.cat([band_ok.expand(*shape, L), summary_ok.expand(*shape, M)], dim=-1)
    probs = masked_softmax(scores, allowed)  # (B, H, N, W, L + M)
    if dropout_p > 0:
        probs = F.dropout(probs, dropout_p)
    context = probs[..., :L] @ v_band + probs[..., L:] @ v_summary.unsqueeze(-3)  # (B, H, N, W, dv)
    return context.flatten(-3, -2)[..., :T, :], None  # (B, H, T, dv)


def _sparse_mask(
    mask: torch.Tensor, gather_idx: torch.Tensor, summary_idx: torch.Tensor, N: int, W: int, L: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The user mask (b, h, t, S) read at the band keys (b, h, N, W|1, L) and summary keys (b, h, N|1, W|1, M)."""
    b, h, t, S = mask.shape
    if t == 1:  # key padding: the same keys for every query
        keys = mask[:, :, 0, :]  # (b, h, S)
        band = keys.index_select(-1, gather_idx).view(b, h, N, 1, L)
        summary = keys.index_select(-1, summary_idx).view(b, h, 1, 1, -1)
        return band, summary
    # A per-query mask: pad the query axis to N W (padded rows are discarded).
    padded = torch.cat([mask, mask.new_zeros(b, h, N * W - t, S)], dim=-2).view(b, h, N, W, S)
    index = gather_idx.view(N, 1, L).expand(b, h, N, W, L)
    band = padded.gather(-1, index)  # (b, h, N, W, L)
    summary = padded.index_select(-1, summary_idx)  # (b, h, N, W, M)
    return band, summary


Kernel = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

KERNELS: dict[str, Kernel] = {
    "math": math_attention,
    "sdpa": sdpa_attention,
    "linear": linear_attention,
    "sparse": sparse_attention,
}


# --------------------------------------------------------------------------- multi-head


class BlockDiagonalLinear(nn.Module):
    """`n_blocks` independent Linear(block_dim, block_dim) maps, one per slice of the features.

    Equal to a nn.Linear(D, D), D = n_blocks * block_dim, whose weight is
    `torch.block_diag(*weight)`: n_blocks * block_dim^2 weights instead of D^2.
    weight (n_blocks, out, in), bias (D,) or None.
    """

    def __init__(self, n_blocks: int, block_dim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_blocks, block_dim, block_dim))
        self.bias = nn.Parameter(torch.empty(n_blocks * block_dim)) if bias else None
        # nn.Linear(block_dim, block_dim)'s initialisation, block by block.
        bound = 1 / math.sqrt(block_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D)."""
        blocks = x.unflatten(-1, (self.weight.shape[0], self.weight.shape[2]))  # (..., H, dh)
        out = torch.einsum("...hi,hoi->...ho", blocks, self.weight).flatten(-2)  # (..., D)
        return out if self.bias is None else out + self.bias


HEADS = ("full", "split")


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 sec. 3.2.2, over a kernel from `KERNELS`.

    heads="full": each head projects the whole input (one nn.Linear(D, D) per Q, K, V).
    heads="split": the input is cut into n_heads slices of D / n_heads features and
    each head projects only its own slice (`BlockDiagonalLinear`); out_proj stays full.
    kernel: a name in `KERNELS`, or a callable with the kernel signature (e.g.
    `functools.partial(sparse_attention, window=64, stride=64)`).
    dropout applies to the attention probabilities, in training only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        kernel: str | Kernel = "sdpa",
        heads: str = "full",
        bias: bool = True,
    ):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if isinstance(kernel, str):
            if kernel not in KERNELS:
                raise ValueError(f"unknown attention kernel {kernel!r}; valid: {', '.join(KERNELS)}")
            kernel = KERNELS[kernel]
        if heads not in HEADS:
            raise ValueError(f"unknown heads {heads!r}; valid: {', '.join(HEADS)}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.kernel = kernel
        self.heads = heads
        for name in ("q_proj", "k_proj", "v_proj"):
            if heads == "full":
                setattr(self, name, Linear(d_model, d_model, bias=bias))
            else:
                setattr(self, name, BlockDiagonalLinear(n_heads, self.d_head, bias=bias))
        self.out_proj = Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, dh)."""
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(1, 2)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """Queries x (B, T, D) -> (B, H, T, dh)."""
        return self._split_heads(self.q_proj(x))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention: x (B, T, D) -> (q, k, v), each (B, H, T, dh); one product when packing applies."""
        if self.heads == "full":
            q, k, v = stacked([self.q_proj, self.k_proj, self.v_proj], x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values x (B, S, D) -> (k, v), each (B, H, S, dh); cache these when decoding."""
        return self._split_heads(self.k_proj(x)), self._split_heads(self.v_proj(x))

    @property
    def step_kernel(self) -> Kernel:
        """The kernel for a few queries against cached keys (one decoding step).

        `sdpa` steps with `math`: the same product, but the fused CPU kernel's
        per-call setup costs more than the whole product at one query per row
        (1.6-2.5x slower at decoding shapes, `scripts/bench_decode.py --parts`).
        Any other kernel steps with itself.
        """
        return math_attention if self.kernel is sdpa_attention else self.kernel

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        kernel: Kernel | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over projected heads, merged and put through out_proj.

        q (B, H, T, dh), k and v (B, H, S, dh); mask (B, S) key padding, (T, S),
        (B, T, S) or (B, H, T, S), see `normalise_mask`; causal is end-aligned.
        Returns (out (B, T, D), weights (B, H, T, S) if need_weights else None).
        A kernel that returns no weights is replaced by `math_attention` for a
        call with need_weights (`sdpa` and `sparse` do that themselves; `linear`
        returns its own normalised phi(Q) phi(K)^T). ``kernel`` overrides the
        module's kernel for this call (decoding passes `step_kernel`).
        """
        B, _, T, _ = q.shape
        mask = normalise_mask(mask, B, T, k.shape[-2])  # (b, h, t, S)
        dropout_p = self.dropout if self.training else 0.0
        context, weights = (kernel or self.kernel)(
            q, k, v, mask, causal=causal, need_weights=need_weights, dropout_p=dropout_p
        )  # (B, H, T, dh)
        if need_weights and weights is None:
            context, weights = math_attention(q, k, v, mask, causal, True, dropout_p)
        out = self.out_proj(context.transpose(1, 2).flatten(-2))  # (B, T, D)
        return out, weights if need_weights else None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, D), key and value (B, S, D) -> (out (B, T, D), weights (B, H, T, S) or None)."""
        if query is key and key is value:
            q, k, v = self.project_qkv(query)  # each (B, H, T, dh)
        else:
            q = self.project_q(query)  # (B, H, T, dh)
            k = self._split_heads(self.k_proj(key))  # (B, H, S, dh)
            v = self._split_heads(self.v_proj(value))  # (B, H, S, dh)
        return self.attend(q, k, v, mask, causal, need_weights)
