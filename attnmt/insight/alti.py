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

from ..data.batching import collate, token_batches
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
    """sum_h alpha^h_ij W_O^h (W_V^h a_j + b_V^h) for a ``MultiHeadAttention``: (T, S, D), in the module's
    dtype."""
    H, dh = attention.n_heads, attention.d_head
    weight = attention.out_proj.weight
    values = attention.v_proj(attended.to(weight.dtype)).unflatten(-1, (H, dh))  # (S, H, dh)
    # each value through its own head's part of W_O: (S, H, D)
    moved = torch.bmm(values.transpose(0, 1), weight.unflatten(1, (H, dh)).permute(1, 2, 0)).transpose(0, 1)
    # terms[t, s] = sum_h alpha[h, t, s] moved[s, h]: one (T, H) x (H, D) product per source position
    return torch.bmm(weights.to(weight.dtype).permute(2, 1, 0), moved).transpose(0, 1)


def decompose(block: Block, attention, norm, pre_norm: bool, residual: bool = True) -> torch.Tensor:
    """A block's terms (T, J, D): one per attended input, then the residual (unless ``residual`` is False,
    for a block without one), in the output's space (a post-norm block's layer norm applied to each term
    with the standard deviation of their sum)."""
    terms = attention_terms(attention, block.attended, block.weights)  # (T, S, D)
    if residual:
        terms = torch.cat([terms, block.x.to(terms.dtype)[:, None, :]], dim=1)
    if pre_norm:
        return terms
    bias = attention.out_proj.bias if attention.out_proj.bias is not None else 0.0
    total = terms.sum(1) + bias  # (T, D): what the layer norm normalises
    std = torch.sqrt(total.var(-1, unbiased=False, keepdim=True) + norm.eps)  # (T, 1)
    scaled = (terms - terms.mean(-1, keepdim=True)) / std[:, None, :]
    return scaled * norm.weight if norm.weight is not None else scaled


def layer_contributions(block: Block, attention, norm, pre_norm: bool) -> torch.Tensor:
    """(T, S + 1): the shares of the attended inputs and, last, of the residual in each output row. A row
    that no term comes near (a post-norm block whose layer-norm bias outweighs them all) keeps its own
    input: its residual takes it whole, so the composition loses no share."""
    terms = decompose(block, attention, norm, pre_norm)
    found = block_contributions(terms.double(), block.y.to(terms.dtype).double())
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
    """While active, records the blocks of a ``TransformerModel``'s forward pass over a batch;
    ``contributions`` composes one sentence's (its real positions cut out of the padded batch: padding gets
    no attention)."""

    def __init__(self, model) -> None:
        self.model = model
        self.blocks: dict[int, Block] = {}
        self.memory: torch.Tensor | None = None
        self.encoder = {id(layer.sub_attn) for layer in model.encoder}

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
        self.memory = output

    def _block(self, kind: str) -> Callable:
        def hook(module, inputs, output) -> None:
            x, (y, weights) = inputs[0], output
            attended = (module.norm(x) if module.pre_norm else x) if kind == "self" else None
            self.blocks[id(module)] = Block(x, attended, weights, y)
        return hook

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def block(self, sub, b: int, S: int, T: int) -> Block:
        """Sentence ``b``'s part of a recorded block: S source and T target positions."""
        found = self.blocks[id(sub)]
        rows = S if id(sub) in self.encoder else T
        attended = found.attended if found.attended is not None else self.memory
        cols = S if found.attended is None or id(sub) in self.encoder else T
        if found.weights is None or found.weights.shape[-1] != attended.shape[1]:
            raise ConfigError("ALTI+ needs the attention weights over every input position; a linformer "
                              "encoder (model.enc_kernel) attends over projections of them")
        return Block(found.x[b, :rows], attended[b, :cols], found.weights[b, :, :rows, :cols],
                     found.y[b, :rows])

    def contributions(self, b: int = 0, S: int | None = None, T: int | None = None) -> torch.Tensor:
        """(T, S + T) of sentence ``b`` of the recorded pass (``seq2seq_contributions``); S and T its
        lengths (default: the batch's)."""
        S = self.memory.shape[1] if S is None else S
        T = self.blocks[id(self.model.decoder[0].sub_self)].y.shape[1] if T is None else T
        encoder, decoder, pending = [], [], None
        for sub, attention, kind in self._sublayers():
            found = layer_contributions(self.block(sub, b, S, T), attention, sub.norm, sub.pre_norm)
            if id(sub) in self.encoder:
                encoder.append(found)
            elif kind == "self":
                pending = found
            else:
                decoder.append((pending, found))
        return seq2seq_contributions(encoder, decoder)


def _check(model) -> None:
    if not hasattr(model, "decoder") or not hasattr(model, "enc_norm"):
        raise ConfigError("ALTI+ reads a Transformer's blocks; this model has none (model.arch lstm?)")


@torch.no_grad()
def alti_batch(model, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]],
               device="cpu") -> list[torch.Tensor]:
    """ALTI+ of a batch of pairs from one forward pass: per pair (T, S + T) in float64."""
    _check(model)
    batch = collate(src_ids, tgt_ids).to(device)
    was_training = model.training
    model.eval()
    try:
        with Tracer(model) as tracer:
            model(batch, need_attention=True)
        return [tracer.contributions(b, S, T) for b, (S, T) in
                enumerate(zip(batch.src_lengths.tolist(), batch.tgt_lengths.tolist()))]
    finally:
        model.train(was_training)


def alti_pairs(model, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], device="cpu",
               on_pair: Callable[[int], None] | None = None, max_tokens: int = 4000) -> list[Attribution]:
    """ALTI+ of each pair as an ``Attribution`` (source (T, S) and prefix (T, T) shares, each row summing to 1
    over both), the pairs batched by length under ``max_tokens`` padded pieces: one forward pass a batch."""
    _check(model)
    order = sorted(range(len(src_ids)), key=lambda i: (len(src_ids[i]), len(tgt_ids[i])))
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src_ids, tgt_ids)]
    out: list[Attribution | None] = [None] * len(src_ids)
    for chunk in token_batches(lengths, order, max_tokens):
        found = alti_batch(model, [src_ids[i] for i in chunk], [tgt_ids[i] for i in chunk], device)
        for i, shares in zip(chunk, found):
            shares = shares.cpu().numpy()
            S = len(src_ids[i]) + 1
            out[i] = Attribution(shares[:, :S], shares[:, S:])
        if on_pair is not None:
            on_pair(len(chunk))
    return out


def alti_attribution(model, src: Sequence[int], tgt: Sequence[int], device="cpu") -> Attribution:
    """One pair's ALTI+ as an ``Attribution``."""
    return alti_pairs(model, [src], [tgt], device)[0]
