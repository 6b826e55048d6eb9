"""Attention masks and the softmax that respects them.

One convention everywhere: boolean masks, True = may attend. The batch builds
`src_mask` (B, S) once (`batching.padding_mask`); the decoder adds the causal part; cross-attention reuses
`src_mask`. A query row with nothing to attend to gets exact zeros, never NaN.

Letters: B batch, H heads, T query length, S key length.
"""

from __future__ import annotations

import torch


def causal_mask(T: int, device: torch.device | str | None = None, S: int | None = None) -> torch.Tensor:
    """Lower-triangular mask, aligned to the end of the keys.

    Returns (T, S) bool with S defaulting to T. Query t sits at absolute
    position S - T + t and may see keys at positions <= that one, so with S > T
    (incremental decoding, T new queries after S - T cached keys) the last query
    sees every key. With S < T the first T - S queries see nothing.
    """
    if S is None:
        S = T
    query_pos = torch.arange(T, device=device)[:, None] + (S - T)  # (T, 1)
    key_pos = torch.arange(S, device=device)[None, :]  # (1, S)
    return key_pos <= query_pos  # (T, S)


def cross_mask(src_mask: torch.Tensor) -> torch.Tensor:
    """Key-padding mask (B, S) shaped to broadcast over heads and queries: (B, 1, 1, S)."""
    return src_mask[:, None, None, :]


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    """Logical AND of the given masks (broadcast together); None entries are skipped.

    Returns None when every argument is None (no masking at all).
    """
    combined = None
    for mask in masks:
        if mask is None:
            continue
        combined = mask if combined is None else combined & mask
    return combined


def normalise_mask(mask: torch.Tensor | None, B: int, T: int, S: int) -> torch.Tensor | None:
    """Bring any accepted mask shape to 4-D, broadcastable to (B, H, T, S).

    Accepted: (B, S) key padding -> (B, 1, 1, S); (T, S) -> (1, 1, T, S);
    (B, T, S) -> (B, 1, T, S); (B, H, T, S) or any 4-D broadcastable shape as is.
    A 2-D mask that fits both (B, S) and (T, S) (B == T) is read as key padding,
    the common case: the causal part is asked for with `causal=True` instead.
    """
    if mask is None:
        return None
    if mask.dtype != torch.bool:
        raise TypeError(f"attention mask must be bool (True = may attend), got {mask.dtype}")
    shape = tuple(mask.shape)
    if mask.dim() == 2:
        if _fits(shape, (B, S)):
            return mask[:, None, None, :]  # (B, 1, 1, S)
        if _fits(shape, (T, S)):
            return mask[None, None, :, :]  # (1, 1, T, S)
    elif mask.dim() == 3 and _fits(shape, (B, T, S)):
        return mask[:, None, :, :]  # (B, 1, T, S)
    elif mask.dim() == 4 and _fits(shape, (B, shape[1], T, S)):
        return mask
    raise ValueError(
        f"attention mask of shape {shape} fits none of (B, S), (T, S), (B, T, S), (B, H, T, S) "
        f"with B={B}, T={T}, S={S}"
    )


def _fits(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """True if every dim of `shape` equals the target's or is 1 (broadcastable)."""
    return all(have in (want, 1) for have, want in zip(shape, target, strict=True))


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None, dim: int = -1) -> torch.Tensor:
    """Softmax over `dim` that leaves out positions where `mask` is False.

    scores: any shape, e.g. (B, H, T, S); mask: bool broadcastable to it, or None.
    Returns probabilities of the shape of `scores`; a row whose mask is all False
    is exact zeros, with zero (finite) gradients, in fp32, fp16 and bf16.
    """
    if mask is None:
        return torch.softmax(scores, dim=dim)
    # The dtype's lowest finite value, not -inf: a fully masked row then stays
    # finite (uniform) inside softmax, and the fill below zeroes it. -inf would
    # give exp(-inf - -inf) = NaN; a -1e9 literal overflows fp16.
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(filled, dim=dim)
    # Masked entries of a partly masked row are already 0; this zeroes the
    # uniform rows of fully masked queries and blocks their gradients.
    return probs.masked_fill(~mask, 0.0)
