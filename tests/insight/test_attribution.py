"""Gradient attribution (``attribution.py``) on tiny models with random weights, against oracles.

The oracle for the gradients is a central finite difference in float64 of log p(y_t) with respect to the
embedding table's rows: every token of the pair is distinct, so moving one row moves exactly one position's
embedding, through the model's plain forward pass (no hooks); the output layer is not tied to the table
(it would move with the row). Saliency's and input x gradient's shares
are computed from it by hand. Integrated gradients is held to its completeness property.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.insight.attribution import attribute_pair, attribute_pairs, from_attention
from attnmt.models import build_model

SRC, TGT = [5, 6, 7, 8], [9, 10, 11]  # distinct tokens: one table row is one position
VOCAB = 16

CONFIGS = {
    "transformer": TransformerConfig(arch="transformer", d_model=8, n_heads=2, enc_layers=1, dec_layers=2,
                                     d_ff=16, dropout=0.3, share_embeddings=True, tie_output=False),
    "lstm": LSTMConfig(arch="lstm", emb_dim=6, hidden_size=5, attn_dim=4, dropout=0.3),
}


def tiny_model(arch: str, seed: int = 0, dtype=torch.float64, scale: float = 3.0):
    """A model with random weights, times ``scale`` (large enough that the output depends on the input)."""
    torch.manual_seed(seed)
    model = build_model(CONFIGS[arch], VOCAB, VOCAB).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return model.eval()


def log_probs(model, src=SRC, tgt=TGT) -> torch.Tensor:
    batch = collate([src], [tgt])
    with torch.no_grad():
        logits = model(batch).logits[0]  # (T, V)
    return logits.log_softmax(-1).gather(-1, batch.tgt_out[0, :, None])[:, 0]  # (T,)


def finite_difference(model, h: float = 1e-5) -> tuple[np.ndarray, np.ndarray]:
    """d log p(y_t) / d embedding, (T, S, D) for the source positions and (T, T, D) for the decoder's
    inputs (<s> and the target pieces), by central differences on the table rows."""
    batch = collate([SRC], [TGT])
    positions = {"src": batch.src[0].tolist(), "tgt": batch.tgt_in[0].tolist()}
    tables = {"src": model.src_embed.weight, "tgt": model.tgt_embed.weight}
    out = {}
    for side, tokens in positions.items():
        width = tables[side].shape[1]
        grad = np.zeros((len(TGT) + 1, len(tokens), width))
        for j, token in enumerate(tokens):
            for d in range(width):
                values = []
                for sign in (1, -1):
                    with torch.no_grad():
                        tables[side][token, d] += sign * h
                    values.append(log_probs(model))
                    with torch.no_grad():
                        tables[side][token, d] -= sign * h
                grad[:, j, d] = ((values[0] - values[1]) / (2 * h)).numpy()
        out[side] = grad
    return out["src"], out["tgt"]


def shares(src: np.ndarray, tgt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token L2 norms as shares of each row, the prefix kept to the positions at or before t."""
    a, b = np.linalg.norm(src, axis=-1), np.tril(np.linalg.norm(tgt, axis=-1))
    total = a.sum(-1, keepdims=True) + b.sum(-1, keepdims=True)
    return a / total, b / total


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_saliency_and_input_x_gradient_match_finite_differences(arch):
    model = tiny_model(arch)
    grad_src, grad_tgt = finite_difference(model)
    batch = collate([SRC], [TGT])
    with torch.no_grad():
        emb_src = model.src_embed(batch.src)[0].numpy()  # (S, D)
        emb_tgt = model.tgt_embed(batch.tgt_in)[0].numpy()  # (T, D)
    expected = {"saliency": shares(grad_src, grad_tgt),
                "input_x_gradient": shares(grad_src * emb_src, grad_tgt * emb_tgt)}
    for method, (source, prefix) in expected.items():
        found = attribute_pair(model, SRC, TGT, method)
        assert found.source.shape == (len(TGT) + 1, len(SRC) + 1)
        assert found.prefix.shape == (len(TGT) + 1, len(TGT) + 1)
        np.testing.assert_allclose(found.source, source, atol=1e-6, err_msg=method)
        np.testing.assert_allclose(found.prefix, prefix, atol=1e-6, err_msg=method)
    assert not model.training  # left as it was


@pytest.mark.parametrize("arch", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_integrated_gradients_are_complete_within_one_percent_at_64_steps(arch, seed):
    """Sum of the attributions = F(e) - F(baseline) (Sundararajan et al. 2017): the rows' errors
    (``delta``) together within 1% of the output differences, which are checked against the model's own
    forward passes on the embeddings and on all-zero embeddings. (Row by row the error can be larger
    where the path crosses many ReLU kinks; scripts/bench/bench_toy_align.py --attribution reports it.)"""
    model = tiny_model(arch, seed, torch.float32, scale=1.0)
    found = attribute_pair(model, SRC, TGT, "integrated_gradients", steps=64)
    np.testing.assert_allclose(found.gap, log_probs(model).double().numpy() - zero_embedding_log_probs(model),
                               atol=1e-5)
    assert np.abs(found.gap).sum() > 0.05
    assert np.abs(found.delta).sum() <= 0.01 * np.abs(found.gap).sum(), (found.delta, found.gap)
    rows = found.source.sum(-1) + found.prefix.sum(-1)
    np.testing.assert_allclose(rows, 1.0, atol=1e-9)
    few = attribute_pair(model, SRC, TGT, "integrated_gradients", steps=2)
    assert np.abs(few.delta).sum() > np.abs(found.delta).sum()  # the quadrature's error shrinks with steps


def zero_embedding_log_probs(model) -> np.ndarray:
    saved = {id(m): m.weight.detach().clone() for m in (model.src_embed, model.tgt_embed)}
    with torch.no_grad():
        for m in (model.src_embed, model.tgt_embed):
            m.weight.zero_()
        out = log_probs(model).double().numpy()
        for m in (model.src_embed, model.tgt_embed):
            m.weight.copy_(saved[id(m)])
    return out


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient", "integrated_gradients"])
def test_the_prefix_after_a_position_gets_nothing_and_rows_are_shares(method):
    model = tiny_model("transformer", dtype=torch.float32)
    found = attribute_pair(model, SRC, TGT, method, steps=8)
    assert np.all(np.triu(found.prefix, 1) == 0)
    assert np.all(found.source >= 0) and np.all(found.prefix >= 0)
    np.testing.assert_allclose(found.source.sum(-1) + found.prefix.sum(-1), 1.0, atol=1e-9)


def test_pairs_are_independent_of_their_neighbours_and_the_model_mode_is_restored():
    model = tiny_model("lstm", dtype=torch.float32).train()
    pairs = attribute_pairs(model, [SRC, [4, 3, 12]], [TGT, [13, 14]], "saliency")
    assert model.training
    alone = attribute_pairs(model, [[4, 3, 12]], [[13, 14]], "saliency")[0]
    np.testing.assert_allclose(pairs[1].source, alone.source, rtol=1e-5)
    assert pairs[0].source.shape == (4, 5) and pairs[1].source.shape == (3, 4)


def test_worker_processes_give_what_one_process_gives():
    model = tiny_model("transformer", dtype=torch.float32).train()
    src, tgt = [SRC, [4, 3, 12], [7, 5], [6]], [TGT, [13, 14], [9], [10, 11, 12, 13]]
    here = attribute_pairs(model, src, tgt, "integrated_gradients", steps=8, workers=1)
    seen = []
    spread = attribute_pairs(model, src, tgt, "integrated_gradients", steps=8, workers=2, on_pair=seen.append)
    assert model.training and seen == [1, 1, 1, 1]
    for a, b in zip(here, spread, strict=True):
        np.testing.assert_allclose(b.source, a.source, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b.prefix, a.prefix, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b.delta, a.delta, rtol=1e-5, atol=1e-7)


def test_attention_method_is_the_mean_of_every_layer_and_head():
    rng = np.random.default_rng(0)
    cross = [rng.dirichlet(np.ones(5), size=(2, 4)) for _ in range(3)]  # 3 layers of (H 2, T 4, S 5)
    found = from_attention(cross)
    np.testing.assert_allclose(found.source, np.mean([c.mean(0) for c in cross], axis=0))
    assert found.prefix.shape == (4, 4) and not found.prefix.any()


def test_an_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown gradient method 'lime'"):
        attribute_pair(tiny_model("lstm"), SRC, TGT, "lime")
