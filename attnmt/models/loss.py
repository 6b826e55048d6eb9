"""Label-smoothed cross-entropy over non-pad target tokens (Szegedy et al. 2016, sec. 7).

Letters: B batch, T target length, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar: smoothed loss summed over real tokens (what is optimised)
    nll: torch.Tensor  # scalar: plain negative log-likelihood summed over real tokens (for perplexity)
    n_tokens: int


def label_smoothed_nll(logits: torch.Tensor, target: torch.Tensor, pad_id: int,
                       smoothing: float = 0.0) -> LossOutput:
    """logits (B, T, V), target (B, T) -> sums over the non-pad positions of ``target``.

    Sums, not means: the trainer divides by the token count of all accumulated batches (and ranks),
    so that every token weighs the same however the batches were cut. The smoothing mass is spread
    over the whole vocabulary, as ``F.cross_entropy(label_smoothing=...)`` does.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the log-softmax in fp32 even under autocast
    logits = logits.flatten(0, 1)  # (B*T, V)
    target = target.flatten()  # (B*T,)
    # One log-softmax for both sums (F.cross_entropy twice computes it twice): with eps = smoothing,
    # loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p, as F.cross_entropy defines it.
    # (A hand-written backward through logsumexp and exp was slower: ATen's log-softmax kernels are fused.)
    log_probs = torch.log_softmax(logits, dim=-1)  # (B*T, V)
    real = target != pad_id
    per_token = -log_probs.gather(1, target.masked_fill(~real, 0).unsqueeze(1)).squeeze(1)  # (B*T,)
    nll = per_token.masked_fill(~real, 0.0).sum()
    if smoothing == 0.0:
        loss = nll
    else:
        uniform = -log_probs.mean(dim=-1).masked_fill(~real, 0.0).sum()
        loss = (1.0 - smoothing) * nll + smoothing * uniform
    return LossOutput(loss, nll.detach(), int(real.sum()))


def guided_alignment_loss(weights: torch.Tensor, target: torch.Tensor, heads: list[int]) -> torch.Tensor:
    """Guided alignment (Garg et al. 2019, eq. 4): cross-entropy between given alignments and attention.

    weights (B, H, T, S): one layer's cross-attention; target (B, T, S): each supervised target piece's row
    spreads 1 over its linked source pieces, other rows are zero (``batching.alignment_targets``). The
    chosen ``heads`` (0-based) are averaged, so together they learn the links. Returns the sum over the
    supervised rows of -sum_s target * log(attention), a sum like the translation loss's.
    """
    chosen = weights[:, heads].float().mean(1)  # (B, T, S)
    return -(target * torch.log(chosen.clamp_min(1e-9))).sum()
