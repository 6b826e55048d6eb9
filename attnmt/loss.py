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
    logits = logits.flatten(0, 1)  # (B*T, V)
    target = target.flatten()  # (B*T,)
    real = target != pad_id
    loss, nll = SmoothedCrossEntropy.apply(logits, target.masked_fill(~real, 0), real, float(smoothing))
    return LossOutput(loss, nll.detach(), int(real.sum()))


class SmoothedCrossEntropy(torch.autograd.Function):
    """The label-smoothed cross-entropy and the plain one, summed over real rows, with the gradient with
    respect to the logits written out: softmax - (1 - eps) * onehot(target) - eps / V, per real row.

    ``F.cross_entropy`` goes through log_softmax, a gather and a mean, each with its own backward pass
    over the (rows x vocabulary) matrix; this needs one logsumexp and one mean forward, and one
    exp-and-scale pass backward (``scripts/bench_train.py --parts`` measures it). The arithmetic is fp32
    (bf16 or fp16 logits are upcast) whatever autocast says. With eps = smoothing, per row:
    loss = (1 - eps) * (lse - x_target) + eps * (lse - mean(x)), the definition ``F.cross_entropy``'s
    ``label_smoothing`` uses; nll = lse - x_target.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, real: torch.Tensor,
                smoothing: float) -> tuple[torch.Tensor, torch.Tensor]:
        # logits (N, V); target (N,), any valid id on padded rows; real (N,) bool
        with torch.autocast(logits.device.type, enabled=False):
            x = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
            lse = torch.logsumexp(x, dim=-1)  # (N,)
            zero = x.new_zeros(())
            # where, not a product with the mask: a padded row stays out even when it is not finite
            nll = torch.where(real, lse - x.gather(1, target[:, None]).squeeze(1), zero).sum()
            loss = nll.clone() if smoothing == 0.0 else (  # its own tensor: nll is not differentiable
                (1.0 - smoothing) * nll + smoothing * torch.where(real, lse - x.mean(dim=-1), zero).sum())
        ctx.save_for_backward(x, lse, target, real)
        ctx.smoothing, ctx.dtype = smoothing, logits.dtype
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        x, lse, target, real = ctx.saved_tensors
        eps, V = ctx.smoothing, x.size(-1)
        grad = torch.exp(x - lse[:, None])  # the softmax (N, V), a new tensor
        if eps:
            grad.sub_(eps / V)
        grad.mul_(grad_loss)
        grad.scatter_add_(1, target[:, None], (-(1.0 - eps) * grad_loss).expand(x.size(0), 1))
        grad.masked_fill_(~real[:, None], 0.0)
        return grad.to(ctx.dtype), None, None, None


def guided_alignment_loss(weights: torch.Tensor, target: torch.Tensor, heads: list[int]) -> torch.Tensor:
    """Guided alignment (Garg et al. 2019, eq. 4): cross-entropy between given alignments and attention.

    weights (B, H, T, S): one layer's cross-attention; target (B, T, S): each supervised target piece's row
    spreads 1 over its linked source pieces, other rows are zero (``batching.alignment_targets``). The
    chosen ``heads`` (0-based) are averaged, so together they learn the links. Returns the sum over the
    supervised rows of -sum_s target * log(attention), a sum like the translation loss's.
    """
    chosen = weights[:, heads].float().mean(1)  # (B, T, S)
    return -(target * torch.log(chosen.clamp_min(1e-9))).sum()
