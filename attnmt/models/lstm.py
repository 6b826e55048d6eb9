"""The attention LSTM encoder-decoder: Bahdanau et al. 2015 (additive attention over a bidirectional
encoder) with Luong et al. 2015's input feeding.

Letters: B batch, S source length, T target length, E embedding width, H encoder hidden size per
direction (the memory is 2H wide), Hd decoder hidden size (default 2H), L decoder layers, V vocabulary.

One decoder step (t = 1 .. T):
    h_t = LSTM([embed(y_{t-1}); a_{t-1}], state_{t-1})   input feeding: a_{t-1} is the last attentional vector
    c_t, alpha_t = attention(h_t, memory, src_mask)        alpha_t (B, S): where the model looks
    a_t = tanh(W_c [h_t; c_t])                             Luong et al. 2015, eq. 5
    logits_t = W_o dropout(a_t)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..config.schema import LSTMConfig
from .attention import Attention
from .dropout import Dropout
from .protocol import DecoderState, ModelOutput, per_row, per_sentence, select_rows, to_blocks


@dataclass(frozen=True, kw_only=True, eq=False)
class LSTMState(DecoderState):
    """The LSTM's decoding state (``models/protocol.py``): N rows = sentences x beams."""

    memory: torch.Tensor = per_sentence()  # (B, S, 2H) the encoder's output
    keys: torch.Tensor = per_sentence()  # (B, S, *) the attention's projected keys: once, not once per step
    src_mask: torch.Tensor = per_sentence()  # (B, S)
    h: torch.Tensor = per_row()  # (N, L, Hd) batch first, so that select can reorder it
    c: torch.Tensor = per_row()  # (N, L, Hd)
    feed: torch.Tensor = per_row()  # (N, out_dim) the last attentional vector (input feeding)


class LSTMModel(nn.Module):
    def __init__(self, cfg: LSTMConfig, src_vocab_size: int, tgt_vocab_size: int, pad_id: int = 0) -> None:
        super().__init__()
        if cfg.share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                "model.share_embeddings needs one joint vocabulary, "
                f"got {src_vocab_size} source and {tgt_vocab_size} target pieces"
            )
        self.cfg, self.pad_id = cfg, pad_id
        H, E = cfg.hidden_size, cfg.emb_dim
        Hd = self.dec_hidden = cfg.dec_hidden_size or 2 * H
        self.out_dim = E if cfg.tie_embeddings else Hd
        self.src_embed = nn.Embedding(src_vocab_size, E, padding_idx=pad_id)
        self.tgt_embed = (self.src_embed if cfg.share_embeddings
                          else nn.Embedding(tgt_vocab_size, E, padding_idx=pad_id))
        self.dropout = Dropout(cfg.dropout)
        self.encoder = nn.LSTM(E, H, cfg.enc_layers, batch_first=True, bidirectional=True,
                               dropout=cfg.dropout if cfg.enc_layers > 1 else 0.0)
        # Bridge: the encoder's final states (both directions) -> the decoder's initial h and c per layer.
        self.bridge_h = nn.Linear(2 * H, cfg.dec_layers * Hd)
        self.bridge_c = nn.Linear(2 * H, cfg.dec_layers * Hd)
        self.decoder = nn.LSTM(E + (self.out_dim if cfg.input_feeding else 0), Hd, cfg.dec_layers,
                               batch_first=True, dropout=cfg.dropout if cfg.dec_layers > 1 else 0.0)
        self.attention = Attention(cfg.attention, Hd, 2 * H, cfg.attn_dim)
        self.combine = nn.Linear(Hd + 2 * H, self.out_dim, bias=False)
        self.output = nn.Linear(self.out_dim, tgt_vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tgt_embed.weight

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> LSTMState:
        """src (B, S) -> the decoding state: memory, projected keys, initial decoder state."""
        lengths = src_mask.sum(1).clamp(min=1)  # (B,)
        x = self.dropout(self.src_embed(src))  # (B, S, E)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, (h_n, c_n) = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))  # (B, S, 2H)
        memory = self.dropout(memory)
        B, L, Hd = src.size(0), self.cfg.dec_layers, self.dec_hidden
        # Last layer's forward and backward final states: (2, B, H) -> (B, 2H).
        h_last = torch.cat([h_n[-2], h_n[-1]], dim=-1)
        c_last = torch.cat([c_n[-2], c_n[-1]], dim=-1)
        # (B, L, Hd): batch first so select() can reorder it
        h0 = torch.tanh(self.bridge_h(h_last)).view(B, L, Hd)
        c0 = self.bridge_c(c_last).view(B, L, Hd)
        keys = self.attention.project_keys(memory)
        return LSTMState(memory=memory, keys=keys, src_mask=src_mask, h=h0, c=c0,
                         feed=memory.new_zeros(B, self.out_dim))

    def _recur(self, x: torch.Tensor, state: LSTMState) -> tuple[torch.Tensor, torch.Tensor, LSTMState]:
        """One step of the recurrence from the embedded (and dropped-out) tokens x (N, E): returns the
        attentional vector a_t (N, out_dim), the attention (N, S) and the new state."""
        if self.cfg.input_feeding:
            x = torch.cat([x, state.feed], dim=-1)  # (B, E + out_dim)
        hc = (state.h.transpose(0, 1).contiguous(), state.c.transpose(0, 1).contiguous())  # (L, B, Hd) each
        out, (h, c) = self.decoder(x[:, None], hc)  # out (B, 1, Hd)
        query = out[:, 0]  # (N, Hd)
        # A sentence's beams are extra queries of it: memory and keys are never copied per beam.
        context, weights = self.attention(to_blocks(query, state.beams), state.keys, state.memory,
                                          state.src_mask)
        context, weights = context.flatten(0, 1), weights.flatten(0, 1)  # (N, 2H), (N, S)
        feed = torch.tanh(self.combine(torch.cat([query, context], dim=-1)))  # (B, out_dim)
        return feed, weights, dataclasses.replace(state, h=h.transpose(0, 1), c=c.transpose(0, 1), feed=feed)

    def step(self, tokens: torch.Tensor, state: LSTMState, need_attention: bool = False):
        """tokens (N,) -> (logits (N, V), new state, attention (N, S) or None); N = sentences x beams."""
        feed, weights, new_state = self._recur(self.dropout(self.tgt_embed(tokens)), state)  # (B, E) in
        logits = self.output(self.dropout(feed))  # (B, V)
        return logits, new_state, (weights if need_attention else None)

    def forward(self, batch, need_attention: bool = False, align_layer: int | None = None,
                full_context: bool = False) -> ModelOutput:
        """Teacher forcing: step through tgt_in, returning logits (B, T, V) and, if asked, the attention
        (B, 1, T, S) (``need_attention``, or ``align_layer`` 0: the one attention, for guided alignment).
        The recurrence reads the target left to right only, so there is no ``full_context`` pass.

        The same computation as ``step`` after ``step``, with what does not depend on the recurrence done
        once for all T positions: the embedding and its dropout before the loop, the dropout and the
        vocabulary-wide output product after it (one (B*T, out_dim) x (out_dim, V) product instead of T)."""
        if full_context:
            raise ValueError("full-context alignment needs a Transformer: the LSTM decoder reads its target "
                             "left to right")
        state = self.encode(batch.src, batch.src_mask)
        embedded = self.dropout(self.tgt_embed(batch.tgt_in))  # (B, T, E)
        feeds, weights = [], []
        need = need_attention or align_layer is not None
        for t in range(batch.tgt_in.size(1)):
            feed, w, state = self._recur(embedded[:, t], state)
            feeds.append(feed)
            weights.append(w)
        logits = self.output(self.dropout(torch.stack(feeds, dim=1)))  # (B, T, V)
        cross = torch.stack(weights, dim=1)[:, None] if need else None  # (B, 1, T, S)
        attention = {"cross": [cross]} if need_attention else None
        return ModelOutput(logits, attention, cross if align_layer is not None else None)

    def select(self, state: LSTMState, index: torch.Tensor, inplace: bool = False) -> LSTMState:
        """Keep or repeat rows (N',); the per-sentence part moves only when the sentences change. Always
        a copy (``inplace`` is ignored: the per-row state is a few vectors per row)."""
        return select_rows(state, index, state.src_mask.size(0))
