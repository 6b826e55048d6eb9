"""Gradient attribution beside attention: how much each source piece, and each piece of the target prefix,
contributes to the prediction of each target piece.

Letters: N rows, S source length (pieces + EOS), T target length (pieces + EOS; the decoder's inputs are
``<s>`` + pieces, also T), D embedding width.

The model is read under teacher forcing with the outputs of its two embeddings (``src_embed`` and
``tgt_embed``, which may be one shared module) replaced by tensors autograd tracks, through forward hooks:
F_t(e) = log p(y_t | y_<t, x) for every target position t. The gradient methods are captum's (the
``attribute`` extra):

- ``saliency``: |dF_t/de| (Simonyan et al. 2014);
- ``input_x_gradient``: e * dF_t/de (Shrikumar et al. 2016);
- ``integrated_gradients``: (e - e') times the mean gradient on the straight path from the baseline e'
  (all-zero embeddings; the positions are added after the embedding and stay) to e, at ``steps`` points
  of Gauss-Legendre quadrature (Sundararajan et al. 2017). Completeness: a row's attributions sum to
  F_t(e) - F_t(e'), up to the quadrature's error, which ``Attribution.delta`` reports;
- ``attention``: the cross-attention ``attnmt align`` reads by default (every layer and head averaged),
  for comparison; it gives the prefix nothing.

Target positions are attributed one at a time, the decoder fed only the t + 1 inputs position t sees
(the causal mask makes the rest irrelevant, so the pieces after t get nothing by construction): one
forward and backward pass per position, of ``steps`` rows for integrated gradients (cut into batches of
at most ``max_tokens`` pieces). Batching every position of a sentence into one pass (captum's per-row
``target``) computed the same in about the same time on the CPU (the backward passes dominate). A token's
score is the L2 norm of its D attributions (inseq's default); each row's scores are normalised into
shares that sum to 1 over the source pieces and the target prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .batching import collate
from .errors import ConfigError
from .tokenizer import EOS_ID

METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "attention")
GRADIENT_METHODS = METHODS[:3]


@dataclass
class Attribution:
    """One sentence pair's attribution: rows are the target pieces and EOS (the predictions)."""

    source: np.ndarray  # (T, S) shares of the source pieces and EOS
    prefix: np.ndarray  # (T, T) shares of the decoder's inputs (<s>, the pieces before t): lower triangular
    delta: np.ndarray | None = None
    """Integrated gradients: per row, the sum of the attributions minus F_t(e) - F_t(e'), and
    ``gap`` the difference itself; None for the other methods."""
    gap: np.ndarray | None = None


def captum_attr():
    """captum's ``attr`` module, or a one-line error saying how to install it."""
    try:
        from captum import attr
    except ImportError:
        raise ConfigError("gradient attribution needs captum: pip install 'attnmt[attribute]' "
                          "(or pip install captum)") from None
    return attr


class _Embeddings:
    """While active, the model's embedding modules return the tensors given for the batch's source and
    decoder-input ids (told apart by identity: both models embed ``batch.src`` and ``batch.tgt_in``
    themselves), scaled and positioned by the model as its own embeddings are."""

    def __init__(self, model: torch.nn.Module):
        self.modules = {id(m): m for m in (model.src_embed, model.tgt_embed)}.values()
        self.replace: dict[int, torch.Tensor] = {}

    def _hook(self, module, inputs, output):
        return self.replace.get(id(inputs[0]), output)

    def __enter__(self):
        self.handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()


def _forward(model, src: Sequence[int], tgt: Sequence[int], t: int, device) -> Callable:
    """F(src_emb (N, S, D), prefix_emb (N, t + 1, D)) -> (N,): log p(y_t), the decoder fed only its first
    t + 1 inputs (all that position t sees: the same value as with the whole target, and cheaper)."""
    batches: dict[int, object] = {}
    y_t = (list(tgt) + [EOS_ID])[t]

    def forward(src_emb: torch.Tensor, prefix_emb: torch.Tensor) -> torch.Tensor:
        n = src_emb.size(0)
        if n not in batches:
            batches[n] = collate([src] * n, [tgt[:t]] * n).to(device)
        batch = batches[n]
        with _Embeddings(model) as hooks:
            hooks.replace = {id(batch.src): src_emb, id(batch.tgt_in): prefix_emb}
            logits = model(batch).logits[:, t]  # (N, V)
        return logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)[:, y_t]

    return forward


def _embedded(model, src: Sequence[int], tgt: Sequence[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    batch = collate([src], [tgt]).to(device)
    with torch.no_grad():
        return model.src_embed(batch.src), model.tgt_embed(batch.tgt_in)  # (1, S, D), (1, T, D)


def _norms(x: torch.Tensor) -> np.ndarray:
    """Attributions (..., D) -> each token's L2 norm."""
    return x.detach().double().norm(dim=-1).cpu().numpy()


def _attribute_position(attr, method: str, forward: Callable, inputs: tuple[torch.Tensor, torch.Tensor],
                        steps: int, rows: int) -> tuple[tuple[torch.Tensor, ...], float, float]:
    """One target position's attributions (captum) and, for integrated gradients, its delta and the output
    difference F(e) - F(e') (else 0 and 0)."""
    if method == "saliency":
        return attr.Saliency(forward).attribute(inputs, abs=True), 0.0, 0.0
    if method == "input_x_gradient":
        return attr.InputXGradient(forward).attribute(inputs), 0.0, 0.0
    baselines = tuple(torch.zeros_like(x) for x in inputs)
    found, delta = attr.IntegratedGradients(forward).attribute(
        inputs, baselines=baselines, n_steps=steps, internal_batch_size=rows, return_convergence_delta=True)
    total = sum(float(x.detach().double().sum()) for x in found)  # delta = total - (F(e) - F(e'))
    return found, float(delta.sum()), total - float(delta.sum())


def attribute_pair(model, src: Sequence[int], tgt: Sequence[int], method: str, device="cpu", steps: int = 64,
                   max_tokens: int = 4000) -> Attribution:
    """The attribution of one sentence pair of piece ids (without EOS; ``collate`` adds it) by a gradient
    ``method`` (see the module docstring), one target position at a time."""
    if method not in GRADIENT_METHODS:
        raise ValueError(f"unknown gradient method {method!r}; expected one of {', '.join(GRADIENT_METHODS)}")
    attr = captum_attr()
    src_emb, tgt_emb = _embedded(model, src, tgt, device)
    S, T = src_emb.size(1), tgt_emb.size(1)
    source, prefix, delta, gap = np.zeros((T, S)), np.zeros((T, T)), np.zeros(T), np.zeros(T)
    with torch.backends.cudnn.flags(enabled=False):  # cuDNN's LSTM has no backward in eval mode
        for t in range(T):
            forward = _forward(model, src, tgt, t, device)
            inputs = (src_emb.clone().requires_grad_(), tgt_emb[:, : t + 1].clone().requires_grad_())
            found, delta[t], gap[t] = _attribute_position(attr, method, forward, inputs, steps,
                                                          max(1, max_tokens // (S + t + 1)))
            source[t], prefix[t, : t + 1] = _norms(found[0][0]), _norms(found[1][0])
    total = source.sum(-1, keepdims=True) + prefix.sum(-1, keepdims=True)
    total = np.where(total > 0, total, 1.0)
    ig = method == "integrated_gradients"
    return Attribution(source / total, prefix / total, delta if ig else None, gap if ig else None)


def attribute_pairs(model, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], method: str,
                    device="cpu", steps: int = 64, max_tokens: int = 4000,
                    on_pair: Callable[[int], None] | None = None) -> list[Attribution]:
    """``attribute_pair`` for each pair, with the model in eval mode (restored after), in its own dtype (the
    log-probabilities in at least float32)."""
    was_training = model.training
    model.eval()
    try:
        out = []
        for src, tgt in zip(src_ids, tgt_ids):
            out.append(attribute_pair(model, src, tgt, method, device, steps, max_tokens))
            if on_pair is not None:
                on_pair(1)
        return out
    finally:
        model.train(was_training)


def from_attention(cross: Sequence[np.ndarray]) -> Attribution:
    """The ``attention`` method: one pair's cross-attention, one (H, T, S) array per layer, averaged over
    layers and heads; the prefix gets nothing."""
    source = np.stack(cross).mean((0, 1), dtype=np.float64)  # (T, S)
    return Attribution(source, np.zeros((source.shape[0], source.shape[0])))
