"""Search over the models' shared protocol (``models/protocol.py``): encode once, then step.

Letters: B batch, S source length, V vocabulary.

Lengths: a hypothesis has at most ``floor(max_len_a * source pieces + max_len_b)`` pieces before its
EOS, which is forced at that point; EOS is banned before ``min_len`` pieces. Finished sentences leave
the batch, so the work per step shrinks as sentences end, and a sentence's result never depends on
which others share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .tokenizer import BOS_ID, EOS_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities, EOS included
    attention: torch.Tensor | None = None  # (len(tokens) + 1, S): one row per output step, EOS included


def max_output_lengths(src_mask: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """(B,) most pieces each output may have before EOS; source pieces exclude the source EOS."""
    src_pieces = (src_mask.sum(1) - 1).clamp(min=0).double()  # (B,)
    return torch.floor(src_pieces * max_len_a + max_len_b).long().clamp(min=1)


@torch.no_grad()
def greedy_search(
    model,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    min_len: int = 0,
    need_attention: bool = False,
) -> list[Hypothesis]:
    """The most probable next piece at every step, for a batch src (B, S)."""
    B = src.size(0)
    limits = max_output_lengths(src_mask, max_len_a, max_len_b)  # (B,)
    state = model.encode(src, src_mask)
    alive = torch.arange(B, device=src.device)  # (b,) batch rows still decoding
    tokens = torch.full((B,), BOS_ID, dtype=torch.long, device=src.device)  # (b,)
    outputs: list[list[int]] = [[] for _ in range(B)]
    scores = [0.0] * B
    attention: list[list[torch.Tensor]] = [[] for _ in range(B)]
    t = 0
    while alive.numel():
        logits, state, attn = model.step(tokens, state, need_attention)  # (b, V)
        logp = F.log_softmax(logits.float(), dim=-1)  # (b, V)
        if t < min_len:
            logp[:, EOS_ID] = torch.finfo(logp.dtype).min
        best = logp.argmax(-1)  # (b,)
        best = torch.where(limits[alive] <= t, torch.full_like(best, EOS_ID), best)  # force EOS at the limit
        best_logp = logp.gather(1, best[:, None])[:, 0]  # (b,)
        done = best == EOS_ID
        for row, (i, token, lp) in enumerate(zip(alive.tolist(), best.tolist(), best_logp.tolist())):
            scores[i] += lp
            if need_attention:
                attention[i].append(attn[row])
            if token != EOS_ID:
                outputs[i].append(token)
        if bool(done.any()):
            keep = (~done).nonzero()[:, 0]  # (b',)
            alive, best = alive[keep], best[keep]
            if alive.numel():
                state = model.select(state, keep)
        tokens = best
        t += 1
    return [
        Hypothesis(outputs[i], scores[i], torch.stack(attention[i]) if need_attention else None) for i in range(B)
    ]
