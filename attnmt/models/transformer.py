"""The Transformer encoder-decoder (Vaswani et al. 2017), pre-norm by default, with an explicit KV cache.

Letters: B batch, S source length, T target length, D d_model, H heads, V vocabulary.

Masks follow ``masks.py`` (bool, True = may attend): the encoder uses the source padding mask on keys
only; the decoder's self-attention is causal; cross-attention reuses the source padding mask.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from ..config.schema import TransformerConfig
from .attention import MultiHeadAttention
from .dropout import Dropout
from .kernel_modules import LinformerKernel, PerformerKernel
from .kernels import Kernel, sparse_attention
from .protocol import DecoderState, ModelOutput, per_sentence, select_rows


def sinusoid(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Sinusoidal encodings (Vaswani et al. 2017, sec. 3.5): positions (L,) -> (L, D)."""
    half = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * half / d_model)  # (D/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (L, D/2)
    out = torch.zeros(len(positions), d_model, device=positions.device)
    out[:, 0::2] = torch.sin(angles)
    out[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return out


def sinusoid_concat(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The same waves with all sines first, then all cosines (Marian's layout, OPUS-MT's): positions (L,) ->
    (L, D). Computed in float64, as Marian's own table is, then rounded: at position 500 a float32 angle is
    off by about 3e-5."""
    half = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float64)
    angles = positions.double()[:, None] / torch.pow(10000.0, half / d_model)[None, :]  # (L, ceil(D/2))
    sines = (d_model + 1) // 2
    return torch.cat([torch.sin(angles), torch.cos(angles[:, : d_model - sines])], dim=1).float()


SINUSOIDS = {"sinusoidal": sinusoid, "sinusoidal_concat": sinusoid_concat}


class Positions(nn.Module):
    """Sinusoidal (fixed, any length; two layouts) or learned (up to ``max_positions``) position encodings."""

    def __init__(self, kind: str, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.kind, self.d_model, self.max_positions = kind, d_model, max_positions
        if kind == "learned":
            self.table = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.table.weight, std=d_model**-0.5)
        else:
            # Not persistent: a function of the config, not a weight. On the meta device: its shape alone.
            table = torch.arange(max_positions)
            table = torch.empty(max_positions, d_model) if table.is_meta else SINUSOIDS[kind](table, d_model)
            self.register_buffer("table", table, persistent=False)

    def forward(self, start: int, length: int, device: torch.device) -> torch.Tensor:
        """Encodings of positions start .. start + length - 1: (L, D)."""
        end = start + length
        if self.kind == "learned":
            if end > self.max_positions:
                raise ValueError(f"sequence of {end} positions exceeds model.max_positions = "
                                 f"{self.max_positions}")
            return self.table.weight[start:end]
        if end > self.table.size(0):
            return SINUSOIDS[self.kind](torch.arange(start, end, device=device), self.d_model)
        return self.table[start:end]


class FeedForward(nn.Sequential):
    """The position-wise feed-forward sublayer (sec. 3.3): Linear, ReLU, GELU or SiLU, dropout, Linear."""

    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float) -> None:
        super().__init__(nn.Linear(d_model, d_ff), ACTIVATIONS[activation](), Dropout(dropout),
                         nn.Linear(d_ff, d_model))


ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class Sublayer(nn.Module):
    """A residual around one sublayer: pre-norm x + f(norm(x)), or post-norm norm(x + f(x))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, f) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = f(self.norm(x) if self.pre_norm else x)
        x = x + self.dropout(out)
        return (x if self.pre_norm else self.norm(x)), weights


def encoder_kernel(cfg: TransformerConfig) -> str | Kernel:
    """``cfg.enc_kernel``; ``sparse`` gets its window and stride from the config, never from the padded
    batch width, or a sentence's encoding would depend on the other sentences in its batch. ``linformer``
    and ``performer`` are modules with state, a new one per call (per layer)."""
    if cfg.enc_kernel == "sparse":
        return functools.partial(sparse_attention, window=cfg.sparse_window, stride=cfg.sparse_stride)
    if cfg.enc_kernel == "linformer":
        return LinformerKernel(cfg.linformer_k, cfg.max_positions)
    return performer_kernel(cfg) if cfg.enc_kernel == "performer" else cfg.enc_kernel


def performer_kernel(cfg: TransformerConfig) -> PerformerKernel:
    """A layer's own random features, drawn from the default generator as its weights are."""
    return PerformerKernel(cfg.d_model // cfg.n_heads, cfg.performer_features, seed=None)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, encoder_kernel(cfg),
                                            cfg.heads)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.sub_attn, self.sub_ffn = (Sublayer(cfg.d_model, cfg.dropout, pre),
                                       Sublayer(cfg.d_model, cfg.dropout, pre))

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        # (B, S, D)
        x, weights = self.sub_attn(x, lambda h: self.self_attn(h, h, h, src_mask, need_weights=need_weights))
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        dec_kernel = performer_kernel(cfg) if cfg.dec_kernel == "performer" else cfg.dec_kernel
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, dec_kernel, cfg.heads)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, "sdpa", cfg.heads)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.sub_self, self.sub_cross, self.sub_ffn = (Sublayer(cfg.d_model, cfg.dropout, pre)
                                                       for _ in range(3))

    def _cross_attention(self, h, cross_kv, src_mask, need_weights, beams, kernel=None):
        """h (N, t, D) with ``beams`` rows per sentence of ``cross_kv``: they attend to their sentence as
        extra query positions, so the cross-attention keys and values are never copied per beam.
        Returns (out (N, t, D), weights (N, H, t, S) or None)."""
        N, t, _ = h.shape
        q = self.cross_attn.project_q(h)  # (N, H, t, dh) with N = B * K
        if beams == 1:
            return self.cross_attn.attend(q, cross_kv[0], cross_kv[1], src_mask, need_weights=need_weights,
                                          kernel=kernel)
        B, H = N // beams, q.size(1)
        q = q.view(B, beams, H, t, -1).transpose(1, 2).reshape(B, H, beams * t, -1)  # (B, H, K*t, dh)
        out, weights = self.cross_attn.attend(q, cross_kv[0], cross_kv[1], src_mask,
                                              need_weights=need_weights, kernel=kernel)
        out = out.reshape(N, t, -1)  # (B, K*t, D) -> (N, t, D)
        if weights is not None:
            weights = weights.view(B, H, beams, t, -1).transpose(1, 2).reshape(N, H, t, -1)  # (N, H, t, S)
        return out, weights

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D)
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
        need_cross: bool = False,
        tgt_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Teacher forcing, causal over x; with ``tgt_mask`` (B, T), True for the real target positions,
        every position sees the whole target instead (the full-context alignment pass, Garg et al. 2019).
        Returns (x, self weights, cross weights); ``need_cross`` asks for the cross weights alone."""

        def self_attention(h: torch.Tensor):
            q, k, v = self.self_attn.project_qkv(h)  # each (B, H, T, dh)
            return self.self_attn.attend(q, k, v, tgt_mask, causal=tgt_mask is None,
                                         need_weights=need_weights)

        x, self_weights = self.sub_self(x, self_attention)
        x, cross_weights = self.sub_cross(
            x, lambda h: self._cross_attention(h, cross_kv, src_mask, need_weights or need_cross, 1))
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, self_weights, cross_weights

    def step(
        self,
        x: torch.Tensor,  # (N, 1, D): position ``pos`` of every row
        cache: tuple[torch.Tensor, torch.Tensor],  # keys and values (N, H, capacity, dh), filled up to pos
        pos: int,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
        beams: int,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One decoding step: writes this position's keys and values into ``cache`` at ``pos`` (the
        caller owns the buffers, see ``TransformerModel.step``) and attends over positions 0 .. pos, all
        of which the new position may see. Returns (x, cross weights (N, H, 1, S) or None)."""

        def self_attention(h: torch.Tensor):
            q, k, v = self.self_attn.project_qkv(h)  # each (N, H, 1, dh)
            cache[0][:, :, pos : pos + 1] = k
            cache[1][:, :, pos : pos + 1] = v
            keys, values = cache[0][:, :, : pos + 1], cache[1][:, :, : pos + 1]  # (N, H, pos + 1, dh), views
            return self.self_attn.attend(q, keys, values, None, kernel=self.self_attn.step_kernel)

        x, _ = self.sub_self(x, self_attention)
        x, cross_weights = self.sub_cross(
            x, lambda h: self._cross_attention(h, cross_kv, src_mask, need_weights, beams,
                                               self.cross_attn.step_kernel)
        )
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, cross_weights


class TransformerModel(nn.Module):
    # ``train.gradient_checkpointing``: in training, each layer keeps only its input for the backward pass
    # and computes its inside again there (torch.utils.checkpoint, with the same dropout masks).
    gradient_checkpointing = False

    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int,
                 pad_id: int = 0) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                "model.share_embeddings needs one joint vocabulary, "
                f"got {src_vocab_size} source and {tgt_vocab_size} target pieces"
            )
        self.cfg, self.pad_id = cfg, pad_id
        self.src_embed = nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
        self.tgt_embed = (self.src_embed if cfg.share_embeddings
                          else nn.Embedding(tgt_vocab_size, cfg.d_model, padding_idx=pad_id))
        for embed in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(embed.weight, std=cfg.d_model**-0.5)
            nn.init.zeros_(embed.weight[pad_id])
        self.positions = Positions(cfg.positions, cfg.d_model, cfg.max_positions)
        self.dropout = Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.aligner: nn.Module | None = None  # an alignment layer, attached by ``attach_aligner``
        self.output = nn.Linear(cfg.d_model, tgt_vocab_size, bias=cfg.output_bias)
        if cfg.output_bias:
            nn.init.zeros_(self.output.bias)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight

    def _embed(self, embed: nn.Embedding, tokens: torch.Tensor, start: int) -> torch.Tensor:
        x = embed(tokens)  # (B, L, D)
        if self.cfg.scale_embeddings:
            x = x * math.sqrt(self.cfg.d_model)  # scaled as in sec. 3.4
        return self.dropout(x + self.positions(start, tokens.size(1), tokens.device))

    def _encode(self, src: torch.Tensor, src_mask: torch.Tensor,
                need_weights: bool) -> tuple[torch.Tensor, list]:
        x = self._embed(self.src_embed, src, 0)  # (B, S, D)
        weights = []
        for layer in self.encoder:
            x, w = self._layer(layer, x, src_mask, need_weights)
            weights.append(w)
        return self.enc_norm(x), weights

    def _layer(self, layer: nn.Module, *args):
        """``layer(*args)``, through ``torch.utils.checkpoint`` when gradient checkpointing is on and
        autograd is recording."""
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def _cross_kv(self, memory: torch.Tensor, layers: int | None = None) -> list[tuple[torch.Tensor, ...]]:
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder[:layers]]  # each (B, H, S, dh)

    def forward(self, batch, need_attention: bool = False, align_layer: int | None = None,
                full_context: bool = False, align_only: bool = False) -> ModelOutput:
        """Teacher forcing (``models/protocol.py``). With ``full_context``, the attention asked for
        (``need_attention``, the cross-attention of ``align_layer``) comes from a second pass of the decoder
        in which every position sees the whole target (no causal mask: Garg et al. 2019's alignment pass),
        up to the last layer needed; the logits still come from the causal pass. ``align_only`` (an alignment
        layer over a frozen translation): only the layers its queries need run, and there are no logits."""
        memory, enc_weights = self._encode(batch.src, batch.src_mask, need_attention)  # (B, S, D)
        cross_kvs = self._cross_kv(memory, self.aligner.layer + 1 if align_only else None)
        x = self._embed(self.tgt_embed, batch.tgt_in, 0)  # (B, T, D)
        causal_align = None if full_context else align_layer
        aligner = self.aligner
        aligner = aligner if aligner is not None and (aligner.training or need_attention) else None
        keep = aligner.layer if aligner is not None and not aligner.full_context else None
        causal = cross_kvs[:0] if align_only and aligner.full_context else cross_kvs  # _align has its pass
        top, self_weights, cross_weights, kept = self._decode(
            x, causal, batch.src_mask, need_attention and not full_context, causal_align, keep=keep)
        logits = None if align_only else self.output(self.dec_norm(top))  # (B, T, V)
        if full_context and (need_attention or align_layer is not None):
            layers = len(self.decoder) if need_attention else align_layer + 1
            _, self_weights, cross_weights, _ = self._decode(x, cross_kvs[:layers], batch.src_mask,
                                                             need_attention, align_layer, batch.tgt_mask)
        attention = ({"enc_self": enc_weights, "dec_self": self_weights, "cross": cross_weights}
                     if need_attention else None)
        out = ModelOutput(logits, attention, cross_weights[align_layer] if align_layer is not None else None)
        if aligner is not None:
            self._align(out, aligner, x, cross_kvs, memory, batch, kept)
        return out

    def _align(self, out: ModelOutput, aligner, x, cross_kvs, memory, batch, states) -> None:
        """The alignment layer's weights (``out.alignment``, the attention kind ``align``) and, learning by
        prediction, its logits. Its queries: the decoder's states after its layer in the causal pass
        (``states``), or in a pass that sees the whole target, run here without gradients (they are read
        detached) and after the translation's, so that its dropout draws nothing the translation would."""
        if states is None:
            with torch.no_grad():
                states = self._decode(x, cross_kvs[: aligner.layer + 1], batch.src_mask, False, None,
                                      batch.tgt_mask, keep=aligner.layer)[3]
        output = self.output if aligner.predicts and aligner.training else None
        out.alignment, out.align_logits = aligner(states, memory, batch.src_mask, output)
        if out.attention is not None:
            out.attention["align"] = [out.alignment]

    def _decode(self, x: torch.Tensor, cross_kvs: list, src_mask: torch.Tensor, need_attention: bool,
                align_layer: int | None, tgt_mask: torch.Tensor | None = None, keep: int | None = None):
        """The decoder layers of ``cross_kvs`` (every layer, or the first few) over the embedded target x
        (B, T, D); causal, or with ``tgt_mask`` full-context. Returns (x, self weights, cross weights, the
        states after layer ``keep`` or None), the weights one entry per layer (None where not asked for)."""
        self_weights, cross_weights, kept = [], [], None
        for i, (layer, cross_kv) in enumerate(zip(self.decoder, cross_kvs)):
            x, sw, cw = self._layer(layer, x, cross_kv, src_mask, need_attention, i == align_layer, tgt_mask)
            self_weights.append(sw)
            cross_weights.append(cw)
            kept = x if i == keep else kept
        return x, self_weights, cross_weights, kept

    # ------------------------------------------------------------------ incremental decoding
    #
    # The self-attention cache is one key and one value buffer per layer, (N, H, capacity, dh), of
    # which positions 0 .. pos - 1 are filled: a step writes one position in place instead of
    # concatenating (which copies the whole cache every step), and ``select`` gathers only the filled
    # part. States stay values: the buffers carry a ``CacheFill`` record of how far they were written,
    # and a step from a state that is no longer the newest on its buffers (its slot was written by
    # another step from the same state) copies them first.

    cache_capacity = 16  # positions allocated at first; the buffers double when full

    def _new_cache(self, N: int, capacity: int,
                   like: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        H = self.cfg.n_heads
        shape = (N, H, capacity, self.cfg.d_model // H)
        return [(like.new_empty(shape), like.new_empty(shape)) for _ in self.decoder]

    def _copy_cache(self, cache: list, pos: int, capacity: int, index: torch.Tensor | None = None) -> list:
        """Fresh buffers of ``capacity`` positions holding positions 0 .. pos - 1 of ``cache``: every row,
        or the rows ``index`` (N',)."""
        fresh = self._new_cache(cache[0][0].size(0) if index is None else index.numel(), capacity,
                                cache[0][0])
        for old, new in zip(cache, fresh):
            for a, b in zip(old, new):  # keys, then values
                if index is None:
                    b[:, :, :pos] = a[:, :, :pos]
                elif torch.is_grad_enabled():  # `out=` is not differentiable
                    b[:, :, :pos] = a[:, :, :pos].index_select(0, index)
                else:
                    torch.index_select(a[:, :, :pos], 0, index, out=b[:, :, :pos])
        return fresh

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> TransformerState:
        memory, _ = self._encode(src, src_mask, False)
        # Contiguous: every step multiplies by them, and a (B, H, S, dh) view of (B, S, H, dh) would be
        # copied by each of those products.
        cross_kv = [(k.contiguous(), v.contiguous()) for k, v in self._cross_kv(memory)]
        cache = self._new_cache(src.size(0), self.cache_capacity, memory)
        return TransformerState(src_mask=src_mask, cross_kv=cross_kv, self_kv=cache, filled=CacheFill(0),
                                pos=0)

    def step(self, tokens: torch.Tensor, state: TransformerState, need_attention: bool = False):
        """tokens (N,) -> (logits (N, V), new state, last layer's mean cross weights (N, S) or None)."""
        pos, cache, filled = state.pos, state.self_kv, state.filled.check()
        capacity = cache[0][0].size(2)
        # Fresh buffers when another step wrote past this state, when there is no room left, or when
        # autograd is recording (it must not see a buffer that an earlier step's attention read be written).
        if filled.n != pos or pos == capacity or torch.is_grad_enabled():
            cache, filled = (self._copy_cache(cache, pos, capacity * 2 if pos == capacity else capacity),
                             CacheFill(pos))
        x = self._embed(self.tgt_embed, tokens[:, None], pos)  # (N, 1, D)
        cross = None
        for layer, layer_cache, cross_kv in zip(self.decoder, cache, state.cross_kv):
            x, cross = layer.step(x, layer_cache, pos, cross_kv, state.src_mask, need_attention, state.beams)
        filled.n = pos + 1
        logits = self.output(self.dec_norm(x[:, 0]))  # (N, V)
        new_state = dataclasses.replace(state, self_kv=cache, filled=filled, pos=pos + 1)
        return logits, new_state, (cross[:, :, 0].mean(1) if need_attention else None)

    def select(self, state: TransformerState, index: torch.Tensor, inplace: bool = False) -> TransformerState:
        """Keep or repeat rows (N',); the per-sentence part moves only when the sentences change, and only
        the filled positions of the cache are gathered.

        ``inplace``: the caller is done with ``state`` and with the states it was stepped from, so rows
        move within their shared buffers and only the rows whose parent is another row are copied (beams
        often extend themselves). Using any of those states afterwards raises RuntimeError. With autograd
        recording, always a copy."""
        filled = state.filled.check()
        pos, cache, N = state.pos, state.self_kv, index.numel()
        n_sentences = state.src_mask.size(0)
        if inplace and filled.n == pos and N <= cache[0][0].size(0) and not torch.is_grad_enabled():
            # (m,) rows with a new parent; past half of them (finished sentences shift every row after
            # theirs), one gather into fresh buffers moves less than gathering and writing back in place
            moved = (index != torch.arange(N, device=index.device)).nonzero()[:, 0]
            filled.n = -1  # the old state is spent
            if 2 * moved.numel() <= N:
                for k, v in cache:  # the right side is gathered first: a row may be read and overwritten
                    k[moved, :, :pos], v[moved, :, :pos] = k[index[moved], :, :pos], v[index[moved], :, :pos]
                return select_rows(state, index, n_sentences, self_kv=[(k[:N], v[:N]) for k, v in cache],
                                   filled=CacheFill(pos))
        cache = self._copy_cache(cache, pos, cache[0][0].size(2), index)
        return select_rows(state, index, n_sentences, self_kv=cache, filled=CacheFill(pos))


class CacheFill:
    """How many positions of a set of cache buffers have been written, shared by the states on them;
    -1 once an in-place select has spent them."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def check(self) -> CacheFill:
        if self.n < 0:
            raise RuntimeError("this decoding state, or one stepped from it, was given to select(..., "
                               "inplace=True): it may not be used again")
        return self


@dataclass(frozen=True, kw_only=True, eq=False)
class TransformerState(DecoderState):
    """The Transformer's decoding state (``models/protocol.py``): N rows = sentences x beams."""

    src_mask: torch.Tensor = per_sentence()  # (B, S)
    # per decoder layer, each (B, H, S, dh)
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]] = per_sentence()
    # per decoder layer, each (N, H, capacity, dh); moved by the model
    self_kv: list[tuple[torch.Tensor, torch.Tensor]]
    filled: CacheFill  # how far the self_kv buffers are written
    pos: int  # the next target position
