"""Attention kernels: one signature, a plain dict of them, and a reference twin for every fast one.

Letters: B batch, H heads, T query length, S key length, d head width, N blocks of queries, C / W
block width. Masks are bool, True = may attend (see ``attnmt.models.masks``).

``KERNELS`` maps a name to kernel(q, k, v, mask, causal, need_weights, dropout_p) -> (context (B, H,
T, d), weights (B, H, T, S) or None). Every fast kernel has a plain twin that the tests compare it
with: ``math`` for ``sdpa``, the explicit normalised phi(Q) phi(K)^T for ``linear``, and ``math``
under ``sparse_pattern`` for ``sparse``. Kernels that carry state (Linformer's learned projections,
Performer's random features) are ``nn.Module``s with this signature in ``attnmt.models.kernel_modules``, which
reuses the linear-attention machinery here (``_causal_linear``, ``linear_weights``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from .dropout import dropout
from .masks import causal_mask, combine_masks, masked_softmax


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
    if scores.dtype in (torch.bfloat16, torch.float16):  # under autocast: the softmax in fp32
        weights = masked_softmax(scores.float(), mask).to(scores.dtype)  # (B, H, T, S)
    else:
        weights = masked_softmax(scores, mask)  # (B, H, T, S)
    probs = dropout(weights, dropout_p) if dropout_p > 0 else weights
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
    need_weights, or in bf16 or fp16 on the CPU, it runs `math_attention` instead. Rows with no key to
    attend to
    give zeros (SDPA alone gives NaN).
    """
    if need_weights:
        return math_attention(q, k, v, mask, causal, need_weights, dropout_p)
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        # On the CPU, SDPA's fused kernel in bf16 is slower than fp32 (about 22 ms against 9.5 for a
        # Multi30k batch, forward + backward) and 5x slower than the products written out in bf16.
        return math_attention(q, k, v, mask, causal, False, dropout_p)[0], None
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

    gather_idx, band_ok = _band(query_pos, S, W, causal)  # (N L,), (N, W, L)
    L = band_ok.size(-1)
    k_band = k.index_select(-2, gather_idx).unflatten(-2, (N, L))  # (B, H, N, L, d)
    v_band = v.index_select(-2, gather_idx).unflatten(-2, (N, L))  # (B, H, N, L, dv)

    # Summary columns, shared by every query; keep only those outside the band.
    # (M,); none when the stride passes the last key (a config's fixed stride, a short sentence)
    summary_idx = torch.arange(stride - 1, max(S, stride - 1), stride, device=device)
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
        probs = dropout(probs, dropout_p)
    context = probs[..., :L] @ v_band + probs[..., L:] @ v_summary.unsqueeze(-3)  # (B, H, N, W, dv)
    return context.flatten(-3, -2)[..., :T, :], None  # (B, H, T, dv)


def _band(query_pos: torch.Tensor, S: int, W: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The local band of each block of W queries (query positions (N, W)): the flat indices of the L keys
    the block can reach (N L,), clamped into 0 .. S - 1, and which of them each query may see (N, W, L).

    Block n holds positions p0 .. p0 + W - 1 (p0 = its first query's position), so it can reach keys from
    p0 - W + 1 on: L = 2W - 1 of them when causal (up to the last query), 3W - 2 otherwise."""
    device = query_pos.device
    L = 2 * W - 1 if causal else 3 * W - 2
    key_idx = (query_pos[:, 0] - W + 1)[:, None] + torch.arange(L, device=device)  # (N, L)
    band_offset = query_pos[:, :, None] - key_idx[:, None, :]  # (N, W, L)
    band_ok = ((band_offset >= 0) & (band_offset < W)) if causal else band_offset.abs() < W
    band_ok = band_ok & ((key_idx >= 0) & (key_idx < S))[:, None, :]  # (N, W, L)
    return key_idx.clamp(0, S - 1).flatten(), band_ok


def _sparse_mask(
    mask: torch.Tensor, gather_idx: torch.Tensor, summary_idx: torch.Tensor, N: int, W: int, L: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The user mask (b, h, t, S) read at the band keys (b, h, N, W|1, L) and summary keys
    (b, h, N|1, W|1, M)."""
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
