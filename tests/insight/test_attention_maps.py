"""``teacher_forced_attention`` on tiny random float64 models: every pair's maps cut to its own lengths,
rows that are distributions, the same maps as the pair computed alone (so batching, padding and the order
of the pairs change nothing), the ``kinds`` filter, the token budget, and the model's training flag.

Letters: H heads, T target length (pieces + EOS), S source length (pieces + EOS).
"""

import numpy as np
import pytest
import torch

import attnmt.insight.attention_maps
from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.data.tokenizer import PAD_ID
from attnmt.insight.attention_maps import teacher_forced_attention
from attnmt.models import attention_layout, build_model

V = 12
# Two encoder layers and one decoder layer, so that a kind's layer count is its own.
CONFIGS = {
    "transformer": TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=2, dec_layers=1,
                                     d_ff=32, dropout=0.25),
    "lstm": LSTMConfig(arch="lstm", emb_dim=8, hidden_size=8, enc_layers=1, dec_layers=1, attn_dim=8,
                       dropout=0.25),
}
every_model = pytest.mark.parametrize("name", list(CONFIGS))

# Lengths unlike their order in the list, an empty target and an empty source among them.
SRC_LENGTHS = [5, 1, 7, 3, 0, 4, 2, 6]
TGT_LENGTHS = [4, 3, 6, 0, 2, 5, 2, 1]


def make_model(name, seed=0):
    """A random float64 model (in eval mode) with weights large enough that its attention is far from
    uniform."""
    torch.manual_seed(seed)
    model = build_model(CONFIGS[name], V, V, PAD_ID).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.6)
    return model


def sentences(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=generator).tolist() for n in lengths]


def pairs():
    return sentences(SRC_LENGTHS, seed=1), sentences(TGT_LENGTHS, seed=2)


def expected_shapes(name, src, tgt):
    """kind -> the (H, rows, columns) of each of its layers."""
    layers, heads = attention_layout(CONFIGS[name])
    S, T = len(src) + 1, len(tgt) + 1
    sides = {"cross": (T, S), "enc_self": (S, S), "dec_self": (T, T)}
    return {kind: [(heads, *sides[kind])] * n for kind, n in layers.items()}


@torch.no_grad()
def direct(model, src, tgt):
    """The oracle: the model's own float64 attention for one pair alone, in a batch of one (no padding)."""
    attention = model(collate([src], [tgt]), need_attention=True).attention
    return {kind: [w[0].numpy() for w in per_layer] for kind, per_layer in attention.items()}


def assert_maps_close(ours, expected, atol):
    assert set(ours) == set(expected)
    for kind in expected:
        assert len(ours[kind]) == len(expected[kind]), kind
        for a, b in zip(ours[kind], expected[kind]):
            assert a.shape == b.shape, kind
            np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=kind)


@every_model
def test_maps_are_cut_to_each_pairs_own_lengths(name):
    src_ids, tgt_ids = pairs()
    maps = teacher_forced_attention(make_model(name), src_ids, tgt_ids)
    assert len(maps) == len(src_ids)
    for src, tgt, pair_maps in zip(src_ids, tgt_ids, maps):
        shapes = {kind: [a.shape for a in per_layer] for kind, per_layer in pair_maps.items()}
        assert shapes == expected_shapes(name, src, tgt)
        assert all(isinstance(a, np.ndarray) for per_layer in pair_maps.values() for a in per_layer)


@every_model
def test_rows_are_distributions(name):
    src_ids, tgt_ids = pairs()
    for pair_maps in teacher_forced_attention(make_model(name), src_ids, tgt_ids):
        for kind, per_layer in pair_maps.items():
            for a in per_layer:
                assert (a >= 0).all(), kind
                np.testing.assert_allclose(a.sum(-1), 1.0, rtol=0, atol=1e-6, err_msg=kind)


def test_decoder_self_attention_is_causal():
    src_ids, tgt_ids = pairs()
    for pair_maps in teacher_forced_attention(make_model("transformer"), src_ids, tgt_ids):
        for a in pair_maps["dec_self"]:
            assert (np.triu(a, k=1) == 0).all()
            assert a[:, 0, 0] == pytest.approx(1.0)  # the first position sees only itself


@every_model
def test_batching_changes_nothing(name):
    """Batched (padded, reordered by length) maps equal each pair's maps computed alone, and equal the
    model's own attention on that pair."""
    model = make_model(name)
    src_ids, tgt_ids = pairs()
    batched = teacher_forced_attention(model, src_ids, tgt_ids)
    for src, tgt, ours in zip(src_ids, tgt_ids, batched):
        (alone,) = teacher_forced_attention(model, [src], [tgt])
        assert_maps_close(ours, alone, atol=1e-9)
        assert_maps_close(ours, direct(model, src, tgt), atol=1e-6)  # the arrays are float32


@every_model
def test_a_tiny_token_budget_gives_the_same_maps_as_a_large_one(name, monkeypatch):
    model = make_model(name)
    src_ids, tgt_ids = pairs()
    sizes = []

    def spy(src, tgt=None, *args, **kwargs):
        sizes.append(len(src))
        return collate(src, tgt, *args, **kwargs)

    monkeypatch.setattr(attnmt.insight.attention_maps, "collate", spy)
    large = teacher_forced_attention(model, src_ids, tgt_ids, max_tokens=4000)
    assert sizes == [len(src_ids)]  # one batch
    sizes.clear()
    tiny = teacher_forced_attention(model, src_ids, tgt_ids, max_tokens=1)
    assert sizes == [1] * len(src_ids)  # one pair per batch
    sizes.clear()
    some = teacher_forced_attention(model, src_ids, tgt_ids, max_tokens=16)
    assert 1 < len(sizes) < len(src_ids)
    for a, b, c in zip(large, tiny, some):
        assert_maps_close(b, a, atol=1e-9)
        assert_maps_close(c, a, atol=1e-9)


def test_kinds_keep_only_those_kinds():
    model = make_model("transformer")
    src_ids, tgt_ids = pairs()
    everything = teacher_forced_attention(model, src_ids, tgt_ids)
    assert all(set(m) == {"cross", "enc_self", "dec_self"} for m in everything)
    for kinds in (["cross"], ["enc_self", "dec_self"], ["dec_self"]):
        kept = teacher_forced_attention(model, src_ids, tgt_ids, kinds=kinds)
        for ours, full in zip(kept, everything):
            assert set(ours) == set(kinds)
            assert_maps_close(ours, {kind: full[kind] for kind in kinds}, atol=0)


def test_kinds_the_model_has_not_are_left_out():
    src_ids, tgt_ids = pairs()
    maps = teacher_forced_attention(make_model("lstm"), src_ids, tgt_ids, kinds=["cross", "enc_self"])
    assert all(set(m) == {"cross"} for m in maps)
    assert teacher_forced_attention(make_model("lstm"), src_ids, tgt_ids, kinds=["dec_self"]) == [
        {} for _ in src_ids]


@every_model
def test_it_runs_in_eval_mode_and_restores_the_training_flag(name):
    """The models have dropout 0.25: a training-mode forward would differ from the eval-mode oracle (and
    from one call to the next)."""
    model = make_model(name)
    src_ids, tgt_ids = pairs()
    evaluated = teacher_forced_attention(model, src_ids, tgt_ids)
    assert not model.training
    model.train()
    trained = teacher_forced_attention(model, src_ids, tgt_ids)
    assert model.training and all(m.training for m in model.modules())
    for a, b in zip(trained, evaluated):
        assert_maps_close(a, b, atol=1e-9)
    with torch.no_grad():  # the oracle that the dropout is real: in training mode maps do change
        batch = collate(src_ids[:1], tgt_ids[:1])
        noisy = model(batch, need_attention=True).attention["cross"][0][0].numpy()
    assert not np.allclose(noisy, evaluated[0]["cross"][0], atol=1e-6)


def test_the_training_flag_is_restored_after_an_error():
    model = make_model("transformer").train()
    with pytest.raises(IndexError):
        teacher_forced_attention(model, [[V + 5]], [[4]])  # an id outside the vocabulary
    assert model.training


def test_no_gradient_is_recorded():
    model = make_model("lstm")
    src_ids, tgt_ids = pairs()
    teacher_forced_attention(model, src_ids, tgt_ids)
    assert all(p.grad is None for p in model.parameters())


def test_no_pairs_give_no_maps():
    assert teacher_forced_attention(make_model("transformer"), [], []) == []


def test_as_many_sources_as_targets():
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        teacher_forced_attention(make_model("lstm"), [[4], [5]], [[6]])
