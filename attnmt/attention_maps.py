"""A trained model's attention on given sentence pairs, under teacher forcing, as numpy arrays.

Letters: B batch, H heads, T target length (pieces + EOS), S source length (pieces + EOS).

``model(batch, need_attention=True)`` gives every layer and head at once (``models/protocol.py``);
here it runs on batches of sentence pairs and each sentence's weights are cut out of the padded batch,
so that ``plot.py`` (which knows no model) can draw them and align words with them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .batching import collate

AttentionMaps = dict[str, list[np.ndarray]]
"""kind (``cross``, ``enc_self``, ``dec_self``) -> one array per layer: cross (H, T, S), enc_self
(H, S, S), dec_self (H, T, T); rows are queries and sum to 1."""


@torch.no_grad()
def teacher_forced_attention(
    model,
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    device: torch.device | str = "cpu",
    max_tokens: int = 4000,
    kinds: Sequence[str] | None = None,
) -> list[AttentionMaps]:
    """The attention of ``model`` reading each source (EOS appended) while forced to produce its target
    (BOS + target in, target + EOS out), one ``AttentionMaps`` per pair, in order. Pairs are batched by
    length under ``max_tokens`` padded pieces; ``kinds`` keeps only those kinds (default: all)."""
    if len(src_ids) != len(tgt_ids):
        raise ValueError(f"{len(src_ids)} sources but {len(tgt_ids)} targets")
    was_training = model.training
    model.eval()
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    results: list[AttentionMaps] = [{} for _ in src_ids]
    start = 0
    try:
        while start < len(order):
            end, longest = start, 0
            while end < len(order):
                longest = max(longest, len(src_ids[order[end]]) + 1, len(tgt_ids[order[end]]) + 1)
                if end > start and longest * (end - start + 1) > max_tokens:
                    break
                end += 1
            chunk = order[start:end]
            batch = collate([src_ids[i] for i in chunk], [tgt_ids[i] for i in chunk]).to(device)
            attention = model(batch, need_attention=True).attention  # kind -> [(B, H, rows, cols)] per layer
            lengths = {"src": batch.src_lengths.tolist(), "tgt": batch.tgt_lengths.tolist()}
            for kind, per_layer in attention.items():
                if kinds is not None and kind not in kinds:
                    continue
                rows_side, cols_side = {"cross": ("tgt", "src"), "enc_self": ("src", "src"), "dec_self": ("tgt", "tgt")}[kind]
                stacked = torch.stack(per_layer, dim=1).float().cpu().numpy()  # (B, L, H, rows, cols)
                for b, i in enumerate(chunk):
                    rows, cols = lengths[rows_side][b], lengths[cols_side][b]
                    results[i][kind] = list(stacked[b, :, :, :rows, :cols])
            start = end
    finally:
        model.train(was_training)
    return results


def alignment_matrix(maps: AttentionMaps, layer: int | None) -> np.ndarray:
    """The cross-attention (T, S) to align with: one layer (0-based) averaged over its heads, or with
    ``layer`` None the average over every layer and head."""
    cross = np.stack(maps["cross"])  # (L, H, T, S)
    return cross[layer].mean(0) if layer is not None else cross.mean((0, 1))
