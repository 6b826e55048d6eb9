"""ALTI+ (Ferrando et al. 2022, "Towards Opening the Black Box of Neural Machine Translation: Source and
Target Contributions in the Transformer"): how much each source piece and each piece of the target prefix
contributes to each prediction of a Transformer, through the whole network, from one forward pass.

Letters: S source length (pieces + EOS), T target length (the decoder's inputs ``<s>`` + pieces, also the
predictions: pieces + EOS), D model width, H heads, J the inputs of one block.

ALTI (Ferrando, Gállego and Costa-jussà 2022) reads each attention block (attention plus its residual and
layer norm) as a sum: the block's output y_i is sum_j T_i(x_j) plus biases, where T_i(x_j) =
sum_h alpha^h_ij W_O^h (W_V^h x_j + b_V^h) for the attended inputs x_j (the pre-norm block's normalised
inputs, the cross-attention's encoder outputs) and the residual x_i itself; a post-norm block's layer norm
is linear once its standard deviation is fixed, and is applied to each term. The contribution of x_j to y_i
is max(0, ||y_i||_1 - ||y_i - T_i(x_j)||_1), normalised over j (``block_contributions``). The feed-forward
sublayers work on each position alone and mix nothing.

ALTI+ follows the contributions through the layers (``seq2seq_contributions``): the encoder's blocks
compose into R_enc (S, S), the input pieces' shares in each encoder output; a decoder position's shares
over the inputs (source pieces, then target prefix) start as the position's own input, a self-attention
block mixes them over the prefix, and a cross-attention block splits each row between the residual (the
row's shares so far) and the encoder outputs (their R_enc rows). Each row stays a distribution, so a
prediction's source share is the sum of its source columns: where it falls, the model is predicting from
the prefix alone (Ferrando et al. link low source shares to hallucination).

The network is read through forward hooks on its ``Sublayer`` modules (each block's input, output and
attention), in eval mode, with no gradients: one pass per sentence pair.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..data.batching import collate
from ..errors import ConfigError
from .attribution import Attribution


def block_contributions(components: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    """ALTI's contributions of one block: components (T, J, D), the terms T_i(x_j) of each output row
    (biases left out), and output (T, D), the block's outputs y_i -> (T, J), each row non-negative and
    summing to 1 (a row where nothing contributes stays zero)."""
    distance = (output[:, None, :] - components).abs().sum(-1)  # (T, J)
    raw = (output.abs().sum(-1, keepdim=True) - distance).clamp_min(0.0)
    total = raw.sum(-1, keepdim=True)
    return torch.where(total > 0, raw / total.clamp_min(1e-30), torch.zeros_like(raw))


@dataclass
class Block:
    """One traced attention block: its input x (T, D) (the residual), what it attended over (S, D) (the
    normalised x itself, or the encoder's outputs), its attention (H, T, S) and its output y (T, D)."""

    x: torch.Tensor
    attended: torch.Tensor
    weights: torch.Tensor
    y: torch.Tensor


def attention_terms(attention, attended: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_h alpha^h_ij W_O^h (W_V^h a_j + b_V^h) for a ``MultiHeadAttention``: (T, S, D), in float64 (the
    value projection in the module's own dtype)."""
    H, dh = attention.n_heads, attention.d_head
    weight = attention.out_proj.weight
    values = attention.v_proj(attended.to(weight.dtype)).double().unflatten(-1, (H, dh))  # (S, H, dh)
    w_out = weight.double().unflatten(1, (H, dh))  # (D, H, dh)
    moved = torch.einsum("shk,dhk->hsd", values, w_out)  # (H, S, D): each value through its head's W_O
    return torch.einsum("hts,hsd->tsd", weights.double(), moved)


def decompose(block: Block, attention, norm, pre_norm: bool, residual: bool = True) -> torch.Tensor:
    """A block's terms (T, J, D): one per attended input, then the residual (unless ``residual`` is False,
    for a block without one), in the output's space (a post-norm block's layer norm applied to each term
    with the standard deviation of their sum)."""
    terms = attention_terms(attention, block.attended, block.weights)  # (T, S, D)
    if residual:
        terms = torch.cat([terms, block.x.double()[:, None, :]], dim=1)
    if pre_norm:
        return terms
    bias = attention.out_proj.bias.double() if attention.out_proj.bias is not None else 0.0
    total = terms.sum(1) + bias  # (T, D): what the layer norm normalises
    std = torch.sqrt(total.var(-1, unbiased=False, keepdim=True) + norm.eps)  # (T, 1)
    centred = terms - terms.mean(-1, keepdim=True)
    scaled = centred / std[:, None, :]
    return scaled * norm.weight.double() if norm.weight is not None else scaled


def layer_contributions(block: Block, attention, norm, pre_norm: bool) -> torch.Tensor:
    """(T, S + 1): the shares of the attended inputs and, last, of the residual in each output row. A row
    that no term comes near (a post-norm block whose layer-norm bias outweighs them all) keeps its own
    input: its residual takes it whole, so the composition loses no share."""
    found = block_contributions(decompose(block, attention, norm, pre_norm), block.y.double())
    found[found.sum(-1) == 0, -1] = 1.0
    return found


def seq2seq_contributions(encoder: Sequence[torch.Tensor],
                          decoder: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """ALTI+'s composition: ``encoder`` per layer (S, S + 1) (attended inputs, then the residual), ``decoder``
    per layer (self (T, T + 1), cross (T, S + 1)) -> (T, S + T): each prediction's shares of the source
    pieces and of the decoder's inputs, rows summing to 1."""
    S = encoder[0].shape[0] if encoder else decoder[0][1].shape[1] - 1
    T = decoder[0][0].shape[0]
    dtype = decoder[0][0].dtype
    mixing = torch.eye(S, dtype=dtype)
    for layer in encoder:  # (S, S + 1): mixing = (attended + residual on the diagonal) @ mixing
        mixing = (layer[:, :S] + torch.diag(layer[:, S])) @ mixing
    shares = torch.cat([torch.zeros(T, S, dtype=dtype), torch.eye(T, dtype=dtype)], dim=1)  # (T, S + T)
    for self_layer, cross_layer in decoder:
        shares = (self_layer[:, :T] + torch.diag(self_layer[:, T])) @ shares
        shares = cross_layer[:, S:] * shares
        shares[:, :S] += cross_layer[:, :S] @ mixing
    return shares


class Tracer:
    """While active, records the blocks of one forward pass of a ``TransformerModel`` (batch of one)."""

    def __init__(self, model) -> None:
        self.model = model
        self.blocks: dict[int, Block] = {}
        self.inputs: dict[int, torch.Tensor] = {}
        self.memory: torch.Tensor | None = None

    def _sublayers(self):
        for layer in self.model.encoder:
            yield layer.sub_attn, layer.self_attn, "self"
        for layer in self.model.decoder:
            yield layer.sub_self, layer.self_attn, "self"
            yield layer.sub_cross, layer.cross_attn, "cross"

    def __enter__(self):
        self.handles = [self.model.enc_norm.register_forward_hook(self._memory)]
        for sub, _, kind in self._sublayers():
            self.handles.append(sub.register_forward_hook(self._block(kind)))
        return self

    def _memory(self, module, inputs, output) -> None:
        self.memory = output[0]

    def _block(self, kind: str) -> Callable:
        def hook(module, inputs, output) -> None:
            x, (y, weights) = inputs[0][0], (output[0][0], output[1])
            attended = (module.norm(x) if module.pre_norm else x) if kind == "self" else None
            self.blocks[id(module)] = Block(x, attended, weights[0] if weights is not None else None, y)
        return hook

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def contributions(self) -> torch.Tensor:
        """(T, S + T) from the recorded pass (``seq2seq_contributions``)."""
        encoder, decoder, pending = [], [], None
        for sub, attention, kind in self._sublayers():
            block = self.blocks[id(sub)]
            if block.attended is None:
                block.attended = self.memory
            if block.weights is None or block.weights.shape[-1] != block.attended.shape[0]:
                raise ConfigError("ALTI+ needs the attention weights over every input position; a linformer "
                                  "encoder (model.enc_kernel) attends over projections of them")
            found = layer_contributions(block, attention, sub.norm, sub.pre_norm)
            if sub in [layer.sub_attn for layer in self.model.encoder]:
                encoder.append(found)
            elif kind == "self":
                pending = found
            else:
                decoder.append((pending, found))
        return seq2seq_contributions(encoder, decoder)


@torch.no_grad()
def alti_pair(model, src: Sequence[int], tgt: Sequence[int], device="cpu") -> torch.Tensor:
    """ALTI+ of one sentence pair of piece ids (without EOS; ``collate`` adds it): (T, S + T) in float64."""
    if not hasattr(model, "decoder") or not hasattr(model, "enc_norm"):
        raise ConfigError("ALTI+ reads a Transformer's blocks; this model has none (model.arch lstm?)")
    batch = collate([src], [tgt]).to(device)
    was_training = model.training
    model.eval()
    try:
        with Tracer(model) as tracer:
            model(batch, need_attention=True)
        return tracer.contributions()
    finally:
        model.train(was_training)


def alti_attribution(model, src: Sequence[int], tgt: Sequence[int], device="cpu") -> Attribution:
    """One pair's ALTI+ as an ``Attribution``: source (T, S) and prefix (T, T) shares, each row summing to 1
    over both."""
    found = alti_pair(model, src, tgt, device).cpu().numpy()
    S = len(src) + 1
    return Attribution(found[:, :S], found[:, S:])


def alti_pairs(model, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], device="cpu",
               on_pair: Callable[[int], None] | None = None) -> list[Attribution]:
    """``alti_attribution`` of each pair, one forward pass each."""
    out = []
    for src, tgt in zip(src_ids, tgt_ids):
        out.append(alti_attribution(model, src, tgt, device))
        if on_pair is not None:
            on_pair(1)
    return out
