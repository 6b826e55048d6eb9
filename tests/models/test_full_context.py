"""Full-context alignment (Garg et al. 2019): the Transformer's second decoder pass, in which every target
position sees the whole target, against a hand-written pass through ``F.scaled_dot_product_attention``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.models import build_model

SRC = [[5, 6, 7, 8, 9], [5, 6]]
TGT = [[10, 11, 12, 13], [10]]


def model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=3, d_ff=32,
                            dropout=0.0)
    return build_model(cfg, 20, 20).double().eval()


def by_hand(m, batch) -> torch.Tensor:
    """Decoder layer 1's cross-attention weights (B, H, T, S) with no causal mask: the target's padding
    masked instead, every real position seeing every real position."""
    layer = m.decoder[0]
    memory, _ = m._encode(batch.src, batch.src_mask, False)
    x = m._embed(m.tgt_embed, batch.tgt_in, 0)
    q, k, v = layer.self_attn.project_qkv(layer.sub_self.norm(x))
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=batch.tgt_mask[:, None, None, :])
    x = x + layer.self_attn.out_proj(context.transpose(1, 2).flatten(-2))
    q = layer.cross_attn.project_q(layer.sub_cross.norm(x))
    k, _ = layer.cross_attn.project_kv(memory)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    return scores.masked_fill(~batch.src_mask[:, None, None, :], float("-inf")).softmax(-1)


def test_the_full_context_pass_is_attention_without_the_causal_mask():
    m, batch = model(), collate(SRC, TGT)
    out = m(batch, need_attention=True, full_context=True)
    expected = by_hand(m, batch)
    for b, (s, t) in enumerate(zip(batch.src_lengths.tolist(), batch.tgt_lengths.tolist())):
        torch.testing.assert_close(out.attention["cross"][0][b, :, :t, :s], expected[b, :, :t, :s])
    # the predictions still come from the causal pass
    torch.testing.assert_close(out.logits, m(batch).logits)
    # guided training's pass stops at the taught layer, with the same weights
    taught = m(batch, align_layer=1, full_context=True).alignment
    torch.testing.assert_close(taught, out.attention["cross"][1])


def test_a_row_sees_the_pieces_after_it_only_in_the_full_context_pass():
    m = model(1)
    one, other = collate([SRC[0]], [[10, 11, 12, 13]]), collate([SRC[0]], [[10, 11, 12, 14]])
    for full_context, changes in ((False, [False] * 4 + [True]), (True, [True] * 5)):
        a = m(one, align_layer=2, full_context=full_context).alignment[0]
        b = m(other, align_layer=2, full_context=full_context).alignment[0]
        # rows 0..3 read the inputs <s> 10 11 12; only row 4 reads the changed piece causally
        assert [not torch.allclose(a[:, t], b[:, t]) for t in range(5)] == changes


def test_a_sentence_reads_the_same_alone_and_beside_a_longer_one():
    m, batch = model(2), collate(SRC, TGT)
    together = m(batch, need_attention=True, full_context=True).attention["cross"][2][1, :, :2, :3]
    alone = m(collate(SRC[1:], TGT[1:]), need_attention=True, full_context=True).attention["cross"][2][0]
    torch.testing.assert_close(together, alone)


def test_an_lstm_has_no_full_context_pass():
    lstm = build_model(LSTMConfig(arch="lstm", emb_dim=6, hidden_size=5, attn_dim=4), 20, 20)
    with pytest.raises(ValueError, match="full-context alignment needs a Transformer"):
        lstm(collate(SRC, TGT), align_layer=0, full_context=True)
