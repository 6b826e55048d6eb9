"""The Transformer encoder-decoder (Vaswani et al. 2017), pre-norm by default, with an explicit KV cache.

Letters: B batch, S source length, T target length, D d_model, H heads, V vocabulary.

Masks follow ``masks.py`` (bool, True = may attend): the encoder uses the source padding mask on keys
only; the decoder's self-attention is causal; cross-attention reuses the source padding mask.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from ..attention import Kernel, MultiHeadAttention, sparse_attention
from ..config import TransformerConfig
from .protocol import ModelOutput, select_grouped


def sinusoid(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """Sinusoidal encodings (Vaswani et al. 2017, sec. 3.5): positions (L,) -> (L, D)."""
    half = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * half / d_model)  # (D/2,)
    angles = positions.float()[:, None] * inv_freq[None, :]  # (L, D/2)
    out = torch.zeros(len(positions), d_model, device=positions.device)
    out[:, 0::2] = torch.sin(angles)
    out[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return out


class Positions(nn.Module):
    """Sinusoidal (fixed, any length) or learned (up to ``max_positions``) position encodings."""

    def __init__(self, kind: str, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.kind, self.d_model, self.max_positions = kind, d_model, max_positions
        if kind == "learned":
            self.table = nn.Embedding(max_positions, d_model)
            nn.init.normal_(self.table.weight, std=d_model**-0.5)
        else:
            # Not persistent: it is a function of the config, not a weight, so checkpoints skip it.
            self.register_buffer("table", sinusoid(torch.arange(max_positions), d_model), persistent=False)

    def forward(self, start: int, length: int, device: torch.device) -> torch.Tensor:
        """Encodings of positions start .. start + length - 1: (L, D)."""
        end = start + length
        if self.kind == "learned":
            if end > self.max_positions:
                raise ValueError(f"sequence of {end} positions exceeds model.max_positions = {self.max_positions}")
            return self.table.weight[start:end]
        if end > self.table.size(0):
            return sinusoid(torch.arange(start, end, device=device), self.d_model)
        return self.table[start:end]


class FeedForward(nn.Sequential):
    def __init__(self, d_model: int, d_ff: int, activation: str, dropout: float) -> None:
        super().__init__(nn.Linear(d_model, d_ff), nn.ReLU() if activation == "relu" else nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))


class Sublayer(nn.Module):
    """A residual around one sublayer: pre-norm x + f(norm(x)), or post-norm norm(x + f(x))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: torch.Tensor, f) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, weights = f(self.norm(x) if self.pre_norm else x)
        x = x + self.dropout(out)
        return (x if self.pre_norm else self.norm(x)), weights


def encoder_kernel(cfg: TransformerConfig) -> str | Kernel:
    """``cfg.enc_kernel``; ``sparse`` gets its window and stride from the config, never from the padded
    batch width, or a sentence's encoding would depend on the other sentences in its batch."""
    if cfg.enc_kernel != "sparse":
        return cfg.enc_kernel
    return functools.partial(sparse_attention, window=cfg.sparse_window, stride=cfg.sparse_stride)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, encoder_kernel(cfg), cfg.heads)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.sub_attn, self.sub_ffn = Sublayer(cfg.d_model, cfg.dropout, pre), Sublayer(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor, need_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        x, weights = self.sub_attn(x, lambda h: self.self_attn(h, h, h, src_mask, need_weights=need_weights))  # (B, S, D)
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, cfg.dec_kernel, cfg.heads)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attn_dropout, "sdpa", cfg.heads)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.dropout)
        self.sub_self, self.sub_cross, self.sub_ffn = (Sublayer(cfg.d_model, cfg.dropout, pre) for _ in range(3))

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D)
        self_kv: tuple[torch.Tensor, torch.Tensor] | None,
        cross_kv: tuple[torch.Tensor, torch.Tensor],
        src_mask: torch.Tensor,
        need_weights: bool,
        group: int = 1,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor | None, torch.Tensor | None]:
        """Teacher forcing when ``self_kv`` is None (causal over x); otherwise x is the next position(s)
        and its keys/values are appended to ``self_kv``. x has ``group`` rows per sentence of
        ``cross_kv`` (the beams): they attend to their sentence as extra query positions, so the
        cross-attention keys and values are never copied per beam. Returns (x, new self_kv, self
        weights, cross weights)."""
        new_kv = {}

        def self_attention(h: torch.Tensor):
            q = self.self_attn.project_q(h)  # (B, H, t, dh)
            k, v = self.self_attn.project_kv(h)  # (B, H, t, dh)
            if self_kv is not None:
                k, v = torch.cat([self_kv[0], k], dim=2), torch.cat([self_kv[1], v], dim=2)  # (B, H, past + t, dh)
            new_kv["kv"] = (k, v)
            # End-aligned causal mask: query i sees keys up to past + i; with t = 1 that is all of them.
            causal = self_kv is None or h.size(1) > 1
            return self.self_attn.attend(q, k, v, None, causal=causal, need_weights=need_weights)

        def cross_attention(h: torch.Tensor):
            N, t, _ = h.shape
            q = self.cross_attn.project_q(h)  # (N, H, t, dh) with N = B * group
            if group == 1:
                return self.cross_attn.attend(q, cross_kv[0], cross_kv[1], src_mask, need_weights=need_weights)
            B, H = N // group, q.size(1)
            q = q.view(B, group, H, t, -1).transpose(1, 2).reshape(B, H, group * t, -1)  # (B, H, group*t, dh)
            out, weights = self.cross_attn.attend(q, cross_kv[0], cross_kv[1], src_mask, need_weights=need_weights)
            out = out.reshape(N, t, -1)  # (B, group*t, D) -> (N, t, D)
            if weights is not None:
                weights = weights.view(B, H, group, t, -1).transpose(1, 2).reshape(N, H, t, -1)  # (N, H, t, S)
            return out, weights

        x, self_weights = self.sub_self(x, self_attention)
        x, cross_weights = self.sub_cross(x, cross_attention)
        x, _ = self.sub_ffn(x, lambda h: (self.ffn(h), None))
        return x, new_kv["kv"], self_weights, cross_weights


class TransformerModel(nn.Module):
    def __init__(self, cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"model.share_embeddings needs one joint vocabulary, got {src_vocab_size} source and {tgt_vocab_size} target pieces"
            )
        self.cfg, self.pad_id = cfg, pad_id
        self.src_embed = nn.Embedding(src_vocab_size, cfg.d_model, padding_idx=pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(tgt_vocab_size, cfg.d_model, padding_idx=pad_id)
        for embed in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(embed.weight, std=cfg.d_model**-0.5)
            nn.init.zeros_(embed.weight[pad_id])
        self.positions = Positions(cfg.positions, cfg.d_model, cfg.max_positions)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.dec_layers))
        pre = cfg.norm == "pre"
        self.enc_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if pre else nn.Identity()
        self.output = nn.Linear(cfg.d_model, tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight

    def _embed(self, embed: nn.Embedding, tokens: torch.Tensor, start: int) -> torch.Tensor:
        x = embed(tokens) * math.sqrt(self.cfg.d_model)  # (B, L, D): scaled as in sec. 3.4
        return self.dropout(x + self.positions(start, tokens.size(1), tokens.device))

    def _encode(self, src: torch.Tensor, src_mask: torch.Tensor, need_weights: bool) -> tuple[torch.Tensor, list]:
        x = self._embed(self.src_embed, src, 0)  # (B, S, D)
        weights = []
        for layer in self.encoder:
            x, w = layer(x, src_mask, need_weights)
            weights.append(w)
        return self.enc_norm(x), weights

    def _cross_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attn.project_kv(memory) for layer in self.decoder]  # each (B, H, S, dh)

    def forward(self, batch, need_attention: bool = False) -> ModelOutput:
        memory, enc_weights = self._encode(batch.src, batch.src_mask, need_attention)  # (B, S, D)
        x = self._embed(self.tgt_embed, batch.tgt_in, 0)  # (B, T, D)
        self_weights, cross_weights = [], []
        for layer, cross_kv in zip(self.decoder, self._cross_kv(memory)):
            x, _, sw, cw = layer(x, None, cross_kv, batch.src_mask, need_attention)
            self_weights.append(sw)
            cross_weights.append(cw)
        logits = self.output(self.dec_norm(x))  # (B, T, V)
        attention = {"enc_self": enc_weights, "dec_self": self_weights, "cross": cross_weights} if need_attention else None
        return ModelOutput(logits, attention)

    # ------------------------------------------------------------------ incremental decoding

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> dict:
        memory, _ = self._encode(src, src_mask, False)
        B, H = src.size(0), self.cfg.n_heads
        empty = memory.new_zeros(B, H, 0, self.cfg.d_model // H)  # (B, H, 0, dh)
        return {
            "src_mask": src_mask,  # per sentence
            "cross_kv": self._cross_kv(memory),  # per sentence
            "self_kv": [(empty, empty) for _ in self.decoder],  # per row
            "pos": 0,
            "group": 1,  # rows per sentence
        }

    def step(self, tokens: torch.Tensor, state: dict, need_attention: bool = False):
        """tokens (N,) -> (logits (N, V), new state, head-averaged last-layer cross-attention (N, S) or None)."""
        x = self._embed(self.tgt_embed, tokens[:, None], state["pos"])  # (B, 1, D)
        new_self_kv, cross = [], None
        for layer, self_kv, cross_kv in zip(self.decoder, state["self_kv"], state["cross_kv"]):
            x, kv, _, cross = layer(x, self_kv, cross_kv, state["src_mask"], need_attention, state["group"])
            new_self_kv.append(kv)
        logits = self.output(self.dec_norm(x[:, 0]))  # (B, V)
        new_state = {**state, "self_kv": new_self_kv, "pos": state["pos"] + 1}
        return logits, new_state, (cross[:, :, 0].mean(1) if need_attention else None)

    def select(self, state: dict, index: torch.Tensor) -> dict:
        """Keep or repeat rows (N',); the per-sentence part moves only when the sentences change."""
        return select_grouped(state, index, ("self_kv",), ("src_mask", "cross_kv"), state["src_mask"].size(0))
