"""The models against their own oracles: full teacher forcing vs step-by-step decoding, a reordered
batch vs reordered results, a sentence alone vs padded into a batch, and the unique-parameter count.

Letters: B batch, S source length, T target length, H heads, V vocabulary.
"""

import re

import pytest
import torch
from helpers import CONFIGS
from torch import nn

from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.data.batching import collate
from attnmt.data.tokenizer import PAD_ID
from attnmt.decoding import fastpath
from attnmt.models import build_model, parameter_counts
from attnmt.models.loss import label_smoothed_nll
from attnmt.models.transformer import Positions, sinusoid

V = 20
CONFIG_DIR = CONFIGS
ATOL = 1e-10  # float64 throughout: every comparison below is between two exact computations

TRANSFORMER_BASE = dict(
    d_model=16, n_heads=2, enc_layers=2, dec_layers=2, d_ff=32, dropout=0.1, max_positions=25,
    sparse_window=5, sparse_stride=5
)
# Every encoder kernel, every decoder kernel, both heads modes, both norms and both position kinds
# appear at least once. With sources of up to 10 tokens the sparse pattern (window = stride = 5)
# leaves out keys, so "sparse" is not just dense attention under another name.
TRANSFORMERS = {
    "sdpa/sdpa/full/pre/sinusoidal": dict(),
    "math/math/split/post/learned": dict(
        enc_kernel="math", dec_kernel="math", heads="split", norm="post", positions="learned"
    ),
    "linear/linear/full/post/sinusoidal": dict(enc_kernel="linear", dec_kernel="linear", norm="post"),
    "sparse/sdpa/split/pre/learned": dict(enc_kernel="sparse", heads="split", positions="learned"),
    "sparse/linear/full/post/sinusoidal": dict(
        enc_kernel="sparse", dec_kernel="linear", norm="post", activation="gelu"
    ),
}
LSTM_BASE = dict(emb_dim=12, hidden_size=8, enc_layers=2, dec_layers=2, attn_dim=10, dropout=0.1)
LSTMS = {
    "lstm/additive": dict(attention="additive"),
    "lstm/dot": dict(attention="dot", dec_hidden_size=16),  # dot needs the decoder as wide as the 2H memory
    "lstm/general/no-feeding/tied": dict(
        attention="general", dec_hidden_size=12, input_feeding=False, tie_embeddings=True
    ),
}
CONFIGS = {
    **{
        name: TransformerConfig(arch="transformer", **TRANSFORMER_BASE, **kw)
        for name, kw in TRANSFORMERS.items()
    },
    **{name: LSTMConfig(arch="lstm", **LSTM_BASE, **kw) for name, kw in LSTMS.items()},
}
every_model = pytest.mark.parametrize("name", list(CONFIGS))


def make_model(cfg, seed=0, src_vocab=V, tgt_vocab=V) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(cfg, src_vocab, tgt_vocab, PAD_ID).double().eval()


def sentences(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=generator).tolist() for n in lengths]


# Three pairs of different lengths: after EOS the source is 10 long, the target 9.
SRC = sentences([9, 5, 7], seed=1)
TGT = sentences([4, 8, 2], seed=2)


def batch_of(src=SRC, tgt=TGT):
    return collate(src, tgt)


def step_all(model, batch, state=None, need_attention=False):
    """Teacher-forced incremental decoding along tgt_in: logits (B, T, V) and per-step attention (B, T, S)."""
    state = model.encode(batch.src, batch.src_mask) if state is None else state
    logits, weights = [], []
    for t in range(batch.tgt_in.size(1)):
        step_logits, state, w = model.step(batch.tgt_in[:, t], state, need_attention)
        logits.append(step_logits)
        weights.append(w)
    return torch.stack(logits, 1), (torch.stack(weights, 1) if need_attention else None)


def assert_close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ----------------------------------------------------------------- incremental decoding


@every_model
def test_step_by_step_equals_teacher_forcing(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    with torch.no_grad():
        full = model(batch).logits  # (B, T, V)
        stepped, _ = step_all(model, batch)
    assert full.shape == (3, batch.tgt_in.size(1), V)
    assert_close(stepped, full)


@pytest.mark.parametrize("name", ["sdpa/sdpa/full/pre/sinusoidal", "lstm/additive"])
def test_step_by_step_equals_teacher_forcing_in_fp32(name):
    torch.manual_seed(0)
    model = build_model(CONFIGS[name], V, V, PAD_ID).eval()  # fp32, the fused sdpa path
    batch = batch_of()
    with torch.no_grad():
        full = model(batch).logits
        stepped, _ = step_all(model, batch)
    assert full.dtype == torch.float32
    assert_close(stepped, full, atol=1e-5)


@every_model
def test_select_reorders_state_mid_decoding(name):
    """Beam search: reorder and repeat rows after k steps; every later step equals the reordered original."""
    model = make_model(CONFIGS[name])
    batch = batch_of()
    index = torch.tensor([2, 0, 0, 1, 2])
    T, k = batch.tgt_in.size(1), 3
    with torch.no_grad():
        reference, _ = step_all(model, batch)  # (B, T, V)
        state = model.encode(batch.src, batch.src_mask)
        for t in range(k):
            _, state, _ = model.step(batch.tgt_in[:, t], state)
        state = model.select(state, index)
        for t in range(k, T):
            logits, state, _ = model.step(batch.tgt_in[index, t], state)
            assert_close(logits, reference[index, t])


@every_model
def test_select_right_after_encode(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    index = torch.tensor([1, 1, 2])
    with torch.no_grad():
        reference, _ = step_all(model, batch)
        moved, _ = step_all(model, collate([SRC[i] for i in index], [TGT[i] for i in index]))
        reordered, _ = step_all(
            model,
            batch_of([SRC[i] for i in index], [TGT[i] for i in index]),
            state=model.select(model.encode(batch.src, batch.src_mask), index),
        )
    assert_close(moved, reference[index])
    assert_close(reordered, reference[index])


TRANSFORMER_NAMES = [name for name in CONFIGS if not name.startswith("lstm")]


@pytest.mark.parametrize("name", TRANSFORMER_NAMES)
def test_cache_that_grows_gives_the_same_steps(name, monkeypatch):
    """The self-attention cache starts with room for 2 positions here and doubles as it fills (2, 4, 8,
    16), across selects too: every step still equals teacher forcing."""
    model = make_model(CONFIGS[name])
    monkeypatch.setattr(model, "cache_capacity", 2)
    batch = batch_of()
    index = torch.tensor([2, 0, 0, 1, 2])
    with torch.no_grad():
        reference, _ = step_all(model, batch)
        state = model.encode(batch.src, batch.src_mask)
        capacities = []
        for t in range(batch.tgt_in.size(1)):
            rows = index if t >= 3 else torch.arange(3)
            if t == 3:
                state = model.select(state, index)
            logits, state, _ = model.step(batch.tgt_in[rows, t], state)
            capacities.append(state.self_kv[0][0].size(2))
            assert_close(logits, reference[rows, t])
    assert capacities[0] == 2 and capacities[-1] == 16, capacities


@every_model
def test_a_state_is_a_value(name):
    """Stepping one state twice (two different next tokens) or selecting from it twice gives two
    independent continuations: neither disturbs the other, though the cache is written in place."""
    model = make_model(CONFIGS[name])
    batch = batch_of()
    other = batch_of(SRC, sentences([4, 8, 2], seed=3))  # same sources, different targets
    with torch.no_grad():
        ref_a, _ = step_all(model, batch)
        ref_b, _ = step_all(model, other)
        state = model.encode(batch.src, batch.src_mask)
        _, state, _ = model.step(batch.tgt_in[:, 0], state)  # both start with BOS
        state_a, state_b = state, state
        for t in range(1, batch.tgt_in.size(1)):  # interleaved: a, then b, from the same parents
            logits_a, state_a, _ = model.step(batch.tgt_in[:, t], state_a)
            logits_b, state_b, _ = model.step(other.tgt_in[:, t], state_b)
            assert_close(logits_a, ref_a[:, t])
            assert_close(logits_b, ref_b[:, t])
        # Two selects from one state, then steps from both, then a step from the original again.
        index_a, index_b = torch.tensor([0, 0, 1]), torch.tensor([2, 1])
        state = model.encode(batch.src, batch.src_mask)
        for t in range(3):
            _, state, _ = model.step(batch.tgt_in[:, t], state)
        picked_a, picked_b = model.select(state, index_a), model.select(state, index_b)
        for t in range(3, 5):
            logits_a, picked_a, _ = model.step(batch.tgt_in[index_a, t], picked_a)
            logits_b, picked_b, _ = model.step(batch.tgt_in[index_b, t], picked_b)
            assert_close(logits_a, ref_a[index_a, t])
            assert_close(logits_b, ref_a[index_b, t])
        logits, _, _ = model.step(batch.tgt_in[:, 3], state)
        assert_close(logits, ref_a[:, 3])


@every_model
@pytest.mark.parametrize("index", [[1, 0, 2], [2, 2, 0], [2, 0], [0, 1, 2], [1, 1, 0, 2, 2]], ids=str)
def test_select_in_place_equals_select(name, index):
    """select(..., inplace=True) (the searches' call) continues exactly like the copying select: swaps,
    a row copied over its own parent, dropped rows, no change, and more rows than before."""
    model = make_model(CONFIGS[name])
    batch = batch_of()
    index = torch.tensor(index)
    with torch.no_grad():
        reference, _ = step_all(model, batch)
        state = model.encode(batch.src, batch.src_mask)
        for t in range(3):
            _, state, _ = model.step(batch.tgt_in[:, t], state)
        state = model.select(state, index, inplace=True)
        for t in range(3, batch.tgt_in.size(1)):
            logits, state, _ = model.step(batch.tgt_in[index, t], state)
            assert_close(logits, reference[index, t])


@pytest.mark.parametrize("name", TRANSFORMER_NAMES)
def test_a_state_given_to_select_in_place_is_refused_afterwards(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    with torch.no_grad():
        state = model.encode(batch.src, batch.src_mask)
        _, state, _ = model.step(batch.tgt_in[:, 0], state)
        model.select(state, torch.tensor([1, 0, 2]), inplace=True)
        with pytest.raises(RuntimeError, match="inplace=True"):
            model.step(batch.tgt_in[:, 1], state)


@every_model
def test_decoding_with_gradients_gives_the_teacher_forcing_gradients(name):
    """Stepping and selecting with autograd recording (e.g. sequence-level training) is differentiable:
    the gradient of the stepped logits equals that of the teacher-forced ones."""
    batch = batch_of()
    index = torch.tensor([2, 0, 0, 1, 2])
    grads = []
    for stepped in (False, True):
        model = make_model(CONFIGS[name])
        if stepped:
            state = model.encode(batch.src, batch.src_mask)
            logits = []
            for t in range(batch.tgt_in.size(1)):
                rows = index if t >= 3 else torch.arange(3)
                if t == 3:
                    state = model.select(state, index, inplace=True)  # ignored while recording
                step_logits, state, _ = model.step(batch.tgt_in[rows, t], state)
                logits.append(step_logits)
            loss = sum((lg * torch.linspace(-1, 1, V, dtype=lg.dtype)).sum() for lg in logits)
        else:
            full = model(batch).logits
            loss = sum((full[(index if t >= 3 else torch.arange(3)), t]
                        * torch.linspace(-1, 1, V, dtype=full.dtype)).sum()
                       for t in range(batch.tgt_in.size(1)))
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads):
        assert_close(b, a, atol=1e-8)


@pytest.mark.parametrize("name", TRANSFORMER_NAMES)
def test_fp32_decoding_with_packed_products_follows_teacher_forcing(name, monkeypatch):
    """float32, so the prepacked oneDNN products, the stacked Q/K/V and the fused ReLU all run (the
    float64 tests above take F.linear); a 2-position cache grows through 16 across an in-place select."""
    torch.manual_seed(0)
    model = build_model(CONFIGS[name], V, V, PAD_ID).eval()
    assert fastpath.apply(model) > 0
    monkeypatch.setattr(model, "cache_capacity", 2)
    batch = batch_of(SRC, sentences([12, 17, 9], seed=5))
    index = torch.tensor([2, 0, 0, 1, 2])
    with torch.no_grad():
        full = model(batch).logits
        state = model.encode(batch.src, batch.src_mask)
        for t in range(batch.tgt_in.size(1)):
            rows = index if t >= 3 else torch.arange(3)
            if t == 3:
                state = model.select(state, index, inplace=True)
            logits, state, _ = model.step(batch.tgt_in[rows, t], state)
            assert_close(logits, full[rows, t], atol=1e-5)
    assert state.self_kv[0][0].size(2) == 32


# ----------------------------------------------------------------- padding and batch neighbours


@every_model
def test_extra_padding_changes_no_real_logit(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    B, S, T = batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)
    pad = 7  # S 10 -> 17: ceil(sqrt(S)) would change from 4 to 5, the model's sparse window must not
    padded = collate(SRC, TGT)
    padded.src = torch.cat([batch.src, torch.full((B, pad), PAD_ID)], 1)
    padded.src_mask = torch.cat([batch.src_mask, torch.zeros(B, pad, dtype=torch.bool)], 1)
    padded.tgt_in = torch.cat([batch.tgt_in, torch.full((B, pad), PAD_ID)], 1)
    assert padded.src.size(1) == S + pad
    with torch.no_grad():
        reference = model(batch).logits
        logits = model(padded).logits  # (B, T + pad, V)
    # Every original position, pad or not: later columns cannot reach earlier ones.
    assert_close(logits[:, :T], reference)


@every_model
def test_a_sentence_does_not_depend_on_its_batch(name):
    model = make_model(CONFIGS[name])
    longer_src, longer_tgt = sentences([11], seed=3), sentences([9], seed=4)  # makes S = 12, T = 10
    batch = batch_of(SRC + longer_src, TGT + longer_tgt)
    assert batch.src.size(1) == 12
    with torch.no_grad():
        together = model(batch).logits
        for i in range(len(SRC)):
            alone = model(batch_of([SRC[i]], [TGT[i]])).logits[0]  # (T_i, V)
            assert_close(together[i, : alone.size(0)], alone)


# ----------------------------------------------------------------- causality


@every_model
def test_later_targets_do_not_change_earlier_logits(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    T = batch.tgt_in.size(1)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        reference = model(batch).logits
        for t in range(T - 1):
            changed = collate(SRC, TGT)
            changed.tgt_in[:, t + 1 :] = torch.randint(4, V, (3, T - t - 1), generator=generator)
            logits = model(changed).logits
            assert_close(logits[:, : t + 1], reference[:, : t + 1])
            assert not torch.allclose(logits[:, t + 1 :], reference[:, t + 1 :])


# ----------------------------------------------------------------- attention weights


def check_rows(weights, src_mask):
    """weights (B, H, T, S) over source keys: rows sum to 1, padded keys get exactly 0."""
    assert (weights >= 0).all()
    assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    assert (weights.masked_select(~src_mask[:, None, None, :].expand_as(weights)) == 0).all()


@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformer_attention_shapes_and_rows(name):
    cfg = CONFIGS[name]
    model = make_model(cfg)
    batch = batch_of()
    B, S, T, H = 3, batch.src.size(1), batch.tgt_in.size(1), cfg.n_heads
    with torch.no_grad():
        plain = model(batch)
        out = model(batch, need_attention=True)
        stepped, step_weights = step_all(model, batch, need_attention=True)
    assert plain.attention is None
    assert_close(out.logits, plain.logits, atol=1e-9)  # sdpa and linear switch to their explicit twins
    assert set(out.attention) == {"enc_self", "dec_self", "cross"}
    assert [w.shape for w in out.attention["enc_self"]] == [(B, H, S, S)] * cfg.enc_layers
    assert [w.shape for w in out.attention["dec_self"]] == [(B, H, T, T)] * cfg.dec_layers
    assert [w.shape for w in out.attention["cross"]] == [(B, H, T, S)] * cfg.dec_layers
    for w in out.attention["enc_self"] + out.attention["cross"]:
        check_rows(w, batch.src_mask)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for w in out.attention["dec_self"]:
        check_rows(w, torch.ones(B, T, dtype=torch.bool))
        assert (w.masked_select(~causal.expand_as(w)) == 0).all()
    # step gives the head average of the last layer's cross-attention, one target position at a time
    assert step_weights.shape == (B, T, S)
    assert_close(step_weights, out.attention["cross"][-1].mean(1), atol=1e-9)
    assert_close(stepped, plain.logits, atol=1e-9)


@pytest.mark.parametrize("name", list(TRANSFORMERS)[3:])
def test_sparse_encoder_attention_follows_its_pattern(name):
    """The pattern must cut: some key a dense encoder would see gets weight 0 at a real position."""
    from attnmt.models.kernels import sparse_pattern

    model = make_model(CONFIGS[name])
    batch = batch_of()
    S = batch.src.size(1)
    with torch.no_grad():
        weights = model(batch, need_attention=True).attention["enc_self"]
    pattern = sparse_pattern(S, S, 5, 5)  # (S, S): window = stride = 5, as configured
    assert not pattern.all()
    allowed = pattern & batch.src_mask[:, None, None, :]  # (B, 1, S, S)
    for w in weights:
        assert (w.masked_select(~allowed.expand_as(w)) == 0).all()
        assert (w.masked_select(allowed.expand_as(w)) > 0).all()


@pytest.mark.parametrize("name", list(LSTMS))
def test_lstm_attention_shapes_and_rows(name):
    model = make_model(CONFIGS[name])
    batch = batch_of()
    B, S, T = 3, batch.src.size(1), batch.tgt_in.size(1)
    with torch.no_grad():
        plain = model(batch)
        out = model(batch, need_attention=True)
        _, step_weights = step_all(model, batch, need_attention=True)
    assert plain.attention is None
    assert torch.equal(out.logits, plain.logits)
    assert list(out.attention) == ["cross"]
    [cross] = out.attention["cross"]
    assert cross.shape == (B, 1, T, S)
    check_rows(cross, batch.src_mask)
    assert_close(step_weights, cross[:, 0])


# ----------------------------------------------------------------- shared and tied tensors, counts


def test_transformer_shares_and_ties_one_tensor():
    cfg = CONFIGS["sdpa/sdpa/full/pre/sinusoidal"]
    assert cfg.share_embeddings and cfg.tie_output
    model = make_model(cfg)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    separate = make_model(cfg.model_copy(update={"share_embeddings": False}), src_vocab=V + 5)
    assert separate.src_embed.weight is not separate.tgt_embed.weight
    assert separate.output.weight is separate.tgt_embed.weight
    assert separate.src_embed.weight.shape == (V + 5, 16) and separate.output.weight.shape == (V, 16)
    untied = make_model(cfg.model_copy(update={"tie_output": False}))
    assert untied.output.weight is not untied.tgt_embed.weight
    with pytest.raises(ValueError, match="share_embeddings"):
        make_model(cfg, src_vocab=V + 1)


def test_lstm_shares_and_ties_one_tensor():
    cfg = CONFIGS["lstm/additive"].model_copy(update={"share_embeddings": True, "tie_embeddings": True})
    model = make_model(cfg)
    assert model.src_embed.weight is model.tgt_embed.weight is model.output.weight
    plain = make_model(CONFIGS["lstm/additive"])
    assert plain.src_embed.weight is not plain.tgt_embed.weight
    assert plain.output.weight is not plain.tgt_embed.weight
    with pytest.raises(ValueError, match="share_embeddings"):
        make_model(cfg, tgt_vocab=V + 1)


def test_shared_tensor_gets_gradient_from_every_use():
    """One tensor used as source embedding, target embedding and output: its gradient is the sum of three."""
    cfg = CONFIGS["sdpa/sdpa/full/pre/sinusoidal"]
    batch = batch_of()
    shared = make_model(cfg)
    label_smoothed_nll(shared(batch).logits, batch.tgt_out, PAD_ID).loss.backward()
    untied = make_model(cfg.model_copy(update={"share_embeddings": False, "tie_output": False}))
    untied.load_state_dict(shared.state_dict())  # the state dict names the shared tensor three times
    label_smoothed_nll(untied(batch).logits, batch.tgt_out, PAD_ID).loss.backward()
    expected = sum(getattr(untied, part).weight.grad for part in ("src_embed", "tgt_embed", "output"))
    assert_close(shared.src_embed.weight.grad, expected, atol=1e-9)


def unique_parameter_count(model: nn.Module) -> int:
    tensors = {id(p): p for _, p in model.named_parameters(remove_duplicate=False)}
    return sum(p.numel() for p in tensors.values())


@pytest.mark.parametrize(
    "name, update, tied",
    [
        ("sdpa/sdpa/full/pre/sinusoidal", {}, True),
        ("sdpa/sdpa/full/pre/sinusoidal", {"share_embeddings": False, "tie_output": False}, False),
        ("math/math/split/post/learned", {}, True),
        ("lstm/additive", {"share_embeddings": True, "tie_embeddings": True}, True),
        ("lstm/additive", {}, False),
        ("lstm/general/no-feeding/tied", {}, True),
    ],
)
def test_parameter_counts_count_each_tensor_once(name, update, tied):
    cfg = CONFIGS[name].model_copy(update=update)
    model = make_model(cfg)
    counts = parameter_counts(model)
    with_repeats = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert sum(counts.values()) == unique_parameter_count(model)
    assert (sum(counts.values()) < with_repeats) == tied
    width = getattr(cfg, "d_model", None) or cfg.emb_dim
    assert counts["src_embed"] == V * width
    assert counts["output"] == (0 if tied else model.output.weight.numel())
    if cfg.share_embeddings:
        assert "tgt_embed" not in counts or counts["tgt_embed"] == 0
    else:
        assert counts["tgt_embed"] == V * width


def test_parameter_counts_skip_frozen_tensors():
    model = make_model(CONFIGS["lstm/additive"])
    before = parameter_counts(model)
    model.bridge_h.weight.requires_grad_(False)
    after = parameter_counts(model)
    assert before["bridge_h"] - after["bridge_h"] == model.bridge_h.weight.numel()


# ----------------------------------------------------------------- training step


@every_model
def test_gradient_step_gives_finite_gradients_everywhere(name):
    model = make_model(CONFIGS[name]).train()  # dropout on, as in training
    batch = batch_of()
    out = label_smoothed_nll(model(batch).logits, batch.tgt_out, PAD_ID, smoothing=0.1)
    out.loss.backward()
    for param_name, p in model.named_parameters():
        assert p.grad is not None, param_name
        assert torch.isfinite(p.grad).all(), param_name
    assert any(p.grad.abs().sum() > 0 for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.step()
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(batch).logits).all()


# ----------------------------------------------------------------- positions


def test_sinusoids_continue_past_the_table():
    positions = Positions("sinusoidal", 16, 8)
    long = positions(0, 12, torch.device("cpu"))  # (12, 16)
    assert long.shape == (12, 16)
    assert torch.equal(long[:8], positions.table)
    assert torch.equal(positions(10, 2, torch.device("cpu")), long[10:])
    # sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(the same angle)
    pos, i = 11, torch.arange(8, dtype=torch.float64)
    angle = pos / 10000 ** (2 * i / 16)
    expected = torch.stack([angle.sin(), angle.cos()], -1).flatten()
    torch.testing.assert_close(sinusoid(torch.tensor([pos]), 16)[0].double(), expected, atol=1e-5, rtol=0)


def test_sinusoidal_model_decodes_past_max_positions():
    cfg = CONFIGS["sdpa/sdpa/full/pre/sinusoidal"].model_copy(update={"max_positions": 6})
    model = make_model(cfg)
    batch = batch_of()
    assert batch.src.size(1) > 6 and batch.tgt_in.size(1) > 6
    with torch.no_grad():
        full = model(batch).logits
        stepped, _ = step_all(model, batch)
    assert torch.isfinite(full).all()
    assert_close(stepped, full)


def test_learned_positions_refuse_past_max_positions():
    cfg = CONFIGS["math/math/split/post/learned"].model_copy(update={"max_positions": 6})
    model = make_model(cfg)
    batch = batch_of()
    with pytest.raises(ValueError, match=r"exceeds model\.max_positions = 6"):
        model(batch)
    short = batch_of([s[:4] for s in SRC], [t[:3] for t in TGT])  # 5 source, 4 target positions
    state = model.encode(short.src, short.src_mask)
    for _ in range(6):
        _, state, _ = model.step(short.tgt_in[:, 0], state)
    with pytest.raises(ValueError, match="max_positions"):
        model.step(short.tgt_in[:, 0], state)


# ----------------------------------------------------------------- attnmt info


def printed_total(output: str) -> int:
    match = re.search(r"total\W+([\d,]+)", output)
    assert match, output
    return int(match.group(1).replace(",", ""))


@pytest.mark.parametrize("config", ["toy_transformer.yaml", "toy_lstm.yaml"])
def test_info_prints_the_unique_parameter_total(config):
    from typer.testing import CliRunner

    from attnmt.cli import app
    from attnmt.config.schema import load_config

    result = CliRunner().invoke(app, ["info", str(CONFIG_DIR / config)])
    assert result.exit_code == 0, result.output
    cfg = load_config(CONFIG_DIR / config)
    model = build_model(cfg.model, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size)
    assert printed_total(result.stdout) == unique_parameter_count(model)


def test_info_rejects_heads_that_do_not_divide_d_model(tmp_path):
    from typer.testing import CliRunner

    from attnmt.cli import app

    text = (CONFIG_DIR / "toy_transformer.yaml").read_text()
    assert "n_heads: 4" in text
    config = tmp_path / "bad.yaml"
    config.write_text(text.replace("n_heads: 4", "n_heads: 3"))
    result = CliRunner().invoke(app, ["info", str(config)])
    assert result.exit_code == 2
    assert re.search(r"^error: .*divisible", result.stderr, re.M), result.stderr
    assert "total" not in result.stdout


@pytest.mark.parametrize("name", list(CONFIGS))
def test_align_layer_gives_that_layers_cross_attention_in_the_graph(name):
    """Guided alignment training reads one layer's cross-attention with gradients: ``align_layer`` k gives
    exactly what ``need_attention`` gives for layer k, the logits are unchanged, and nothing else."""
    cfg = CONFIGS[name]
    model = make_model(cfg)
    batch = batch_of()
    with torch.no_grad():
        full = model(batch, need_attention=True)
    layers = len(full.attention["cross"])
    for k in range(layers):
        out = model(batch, align_layer=k)
        assert out.attention is None and out.alignment.requires_grad
        assert_close(out.alignment.detach(), full.attention["cross"][k], atol=1e-6)
        assert_close(out.logits.detach(), full.logits, atol=1e-6)
    assert model(batch).alignment is None
