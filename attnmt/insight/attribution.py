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
``target``) computed the same in about the same time on the CPU (the backward passes dominate); what
does help there is spreading the pairs over processes (``attribute_pairs``' ``workers``). The output
differences F_t(e) - F_t(e') come from one forward pass of the whole target per pair. A token's
score is the L2 norm of its D attributions (inseq's default); each row's scores are normalised into
shares that sum to 1 over the source pieces and the target prefix.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..data.batching import collate
from ..data.pool import default_workers, ordered_map
from ..data.tokenizer import EOS_ID
from ..errors import ConfigError

METHODS = ("saliency", "input_x_gradient", "integrated_gradients", "attention", "alti")
GRADIENT_METHODS = METHODS[:3]  # ``alti`` is ALTI+ (``alti.py``): one forward pass, no gradients


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
                        steps: int, rows: int) -> tuple[torch.Tensor, ...]:
    """One target position's attributions (captum)."""
    if method == "saliency":
        return attr.Saliency(forward).attribute(inputs, abs=True)
    if method == "input_x_gradient":
        return attr.InputXGradient(forward).attribute(inputs)
    baselines = tuple(torch.zeros_like(x) for x in inputs)
    return attr.IntegratedGradients(forward).attribute(inputs, baselines=baselines, n_steps=steps,
                                                       internal_batch_size=rows)


def _output_gaps(model, src: Sequence[int], tgt: Sequence[int], src_emb: torch.Tensor, tgt_emb: torch.Tensor,
                 device) -> np.ndarray:
    """F_t(e) - F_t(e') for every target position t, the baseline e' all zeros: one forward pass of the
    whole target for both (position t sees only its prefix), instead of two per position."""
    batch = collate([src] * 2, [tgt] * 2).to(device)
    with torch.no_grad(), _Embeddings(model) as hooks:
        hooks.replace = {id(batch.src): torch.cat([src_emb, torch.zeros_like(src_emb)]),
                         id(batch.tgt_in): torch.cat([tgt_emb, torch.zeros_like(tgt_emb)])}
        logits = model(batch).logits
    logp = logits.to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(-1)
    found = logp.gather(-1, batch.tgt_out[:, :, None])[..., 0].double().cpu().numpy()  # (2, T)
    return found[0] - found[1]


def attribute_pair(model, src: Sequence[int], tgt: Sequence[int], method: str, device="cpu", steps: int = 64,
                   max_tokens: int = 4000) -> Attribution:
    """The attribution of one sentence pair of piece ids (without EOS; ``collate`` adds it) by a gradient
    ``method`` (see the module docstring), one target position at a time."""
    if method not in GRADIENT_METHODS:
        raise ValueError(f"unknown gradient method {method!r}; expected one of {', '.join(GRADIENT_METHODS)}")
    attr = captum_attr()
    src_emb, tgt_emb = _embedded(model, src, tgt, device)
    S, T = src_emb.size(1), tgt_emb.size(1)
    source, prefix, sums = np.zeros((T, S)), np.zeros((T, T)), np.zeros(T)
    with torch.backends.cudnn.flags(enabled=False):  # cuDNN's LSTM has no backward in eval mode
        for t in range(T):
            forward = _forward(model, src, tgt, t, device)
            inputs = (src_emb.clone().requires_grad_(), tgt_emb[:, : t + 1].clone().requires_grad_())
            rows = max(1, max_tokens // (S + t + 1))
            found = _attribute_position(attr, method, forward, inputs, steps, rows)
            source[t], prefix[t, : t + 1] = _norms(found[0][0]), _norms(found[1][0])
            sums[t] = sum(float(x.detach().double().sum()) for x in found)
    total = source.sum(-1, keepdims=True) + prefix.sum(-1, keepdims=True)
    total = np.where(total > 0, total, 1.0)
    if method != "integrated_gradients":
        return Attribution(source / total, prefix / total)
    gap = _output_gaps(model, src, tgt, src_emb, tgt_emb, device)
    return Attribution(source / total, prefix / total, sums - gap, gap)


def attribute_pairs(model, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], method: str,
                    device="cpu", steps: int = 64, max_tokens: int = 4000,
                    on_pair: Callable[[int], None] | None = None, workers: int | None = None
                    ) -> list[Attribution]:
    """``attribute_pair`` for each pair, with the model in eval mode (restored after), in its own dtype (the
    log-probabilities in at least float32).

    On the CPU the pairs are spread over ``workers`` spawned processes (default: one per core, at most
    ``torch.get_num_threads()``), each with
    a copy of the model and an equal share of the cores' threads: the small matrices of one pair keep two
    threads of one process only partly busy (on 2 cores, 100 toy pairs by integrated gradients took 54 s
    in two processes of one thread against 63 s in one of two, start-up included)."""
    was_training = model.training
    model.eval()
    jobs = [(src, tgt, method, steps, max_tokens) for src, tgt in zip(src_ids, tgt_ids)]
    if workers is None:  # one per core, but never more than the threads torch was given (OMP_NUM_THREADS)
        workers = min(default_workers(), torch.get_num_threads())
    workers = min(workers, len(jobs))  # a process per pair at most
    try:
        if workers > 1 and len(jobs) > 2 and torch.device(device).type == "cpu":
            threads = max(1, torch.get_num_threads() // workers)
            found = ordered_map(_attribute_job, jobs, workers, inline=0, initializer=_start_worker,
                                initargs=(_model_bytes(model), threads))
        else:
            found = (attribute_pair(model, src, tgt, method, device, steps, max_tokens)
                     for src, tgt in zip(src_ids, tgt_ids))
        out = []
        for result in found:
            out.append(result)
            if on_pair is not None:
                on_pair(1)
        return out
    finally:
        model.train(was_training)


_WORKER_MODEL: list = []  # in a worker process: the model it attributes with


def _model_bytes(model) -> bytes:
    """The model as bytes, for the workers: a copy through the pipe (handing them the tensors themselves
    would put the weights in shared memory, which a container may hold at 64 MB)."""
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return buffer.getvalue()


def _start_worker(model: bytes, threads: int) -> None:
    torch.set_num_threads(threads)
    _WORKER_MODEL[:] = [torch.load(io.BytesIO(model), weights_only=False)]  # attnmt's own model, just saved


def _attribute_job(job: tuple) -> Attribution:
    src, tgt, method, steps, max_tokens = job
    return attribute_pair(_WORKER_MODEL[0], src, tgt, method, "cpu", steps, max_tokens)


def from_attention(cross: Sequence[np.ndarray]) -> Attribution:
    """The ``attention`` method: one pair's cross-attention, one (H, T, S) array per layer, averaged over
    layers and heads; the prefix gets nothing."""
    source = np.stack(cross).mean((0, 1), dtype=np.float64)  # (T, S)
    return Attribution(source, np.zeros((source.shape[0], source.shape[0])))
