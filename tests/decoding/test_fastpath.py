"""The opt-in fast path against the plain model: ``PackedLinear`` against ``F.linear``, the stacked Q/K/V
product against three products, the fused ReLU against ReLU, and a whole model with ``fastpath.apply``
against the same model without it. Packed copies follow weight changes, stay out of the state_dict and
out of training, and each row is computed on its own.

These tests run on every build: if a PyTorch upgrade takes the private oneDNN ops away, they fail
(``test_this_build_has_the_private_ops``) instead of letting decoding get slower without a word."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnmt.config.schema import LSTMConfig, TransformerConfig
from attnmt.decoding import fastpath
from attnmt.decoding.fastpath import PackedLinear, PackedMultiHeadAttention
from attnmt.models import build_model
from attnmt.models.attention import MultiHeadAttention


def reference(lin: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)


def test_this_build_has_the_private_ops():
    assert fastpath.available(), (
        "torch.ops.mkldnn._reorder_linear_weight / _linear_pointwise are missing from this PyTorch build: "
        "attnmt/decoding/fastpath.py needs a new way to prepack, or decoding runs without it"
    )


@pytest.mark.parametrize("shape", [(7, 16), (3, 5, 16), (2, 3, 4, 16)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_packed_path_equals_f_linear(shape, bias):
    torch.manual_seed(0)
    lin = PackedLinear(16, 24, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        out = lin(x)
    assert lin._packs  # the packed path ran
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, reference(lin, x), atol=1e-5, rtol=1e-5)


def test_non_contiguous_input_and_inference_mode():
    torch.manual_seed(0)
    lin = PackedLinear(16, 8)
    x = torch.randn(5, 3, 16)[:, 1]  # (5, 16), rows 48 floats apart
    with torch.inference_mode():
        out = lin(x)
    torch.testing.assert_close(out, reference(lin, x.detach()), atol=1e-5, rtol=1e-5)


def test_a_changed_weight_is_packed_again():
    torch.manual_seed(0)
    lin = PackedLinear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = lin(x)
        lin.weight.mul_(2)  # in place: same storage, new version
        after = lin(x)
        expected_after = reference(lin, x)
        lin.load_state_dict({"weight": torch.randn(8, 16), "bias": torch.zeros(8)})  # copied in place
        loaded = lin(x)
        expected_loaded = reference(lin, x)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected_after, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loaded, expected_loaded, atol=1e-5, rtol=1e-5)


def test_each_row_is_computed_alone():
    """A row's result does not depend on the rows beside it (bitwise), so a sentence's translation
    does not depend on its batch; MKL's sgemm behind F.linear does not promise that."""
    torch.manual_seed(0)
    lin = PackedLinear(256, 1000)
    x = torch.randn(320, 256)
    with torch.no_grad():
        full = lin(x)
        for rows in (slice(0, 1), slice(100, 101), slice(0, 64), slice(5, 12), slice(319, 320)):
            assert torch.equal(lin(x[rows]), full[rows])


def test_training_and_other_dtypes_use_f_linear():
    torch.manual_seed(0)
    lin = PackedLinear(16, 8)
    x = torch.randn(4, 16)
    out = lin(x)  # grad enabled: the plain path, differentiable
    assert not lin._packs and out.requires_grad
    out.sum().backward()
    assert lin.weight.grad is not None
    double = PackedLinear(16, 8).double()
    with torch.no_grad():
        assert torch.equal(double(x.double()), reference(double, x.double()))
    assert not double._packs


def test_switch_off_gives_f_linear_exactly(monkeypatch):
    monkeypatch.setattr(fastpath, "ENABLED", False)
    torch.manual_seed(0)
    lin = PackedLinear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(lin(x), reference(lin, x))
    assert not lin._packs


def test_packed_copy_stays_out_of_state_dict_and_copies():
    lin = PackedLinear(16, 8)
    with torch.no_grad():
        lin(torch.randn(2, 16))
    assert lin._packs
    assert set(lin.state_dict()) == {"weight", "bias"}
    clone = copy.deepcopy(lin)
    assert not clone._packs
    with torch.no_grad():
        clone.weight.add_(1)  # the copy has its own weight, and packs it
        x = torch.randn(3, 16)
        torch.testing.assert_close(clone(x), reference(clone, x), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lin(x), reference(lin, x), atol=1e-5, rtol=1e-5)


def test_a_layer_made_under_inference_mode_works():
    with torch.inference_mode():
        lin = PackedLinear(16, 8)  # an inference tensor weight: no version counter
        x = torch.randn(4, 16)
        out, expected = lin(x), reference(lin, x)
        lin.weight.mul_(2)  # allowed in inference mode, and must be seen
        twice, expected_twice = lin(x), reference(lin, x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(twice, expected_twice, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, twice)


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "plain"])
def test_fused_relu_equals_relu_of_the_product(packing, monkeypatch):
    monkeypatch.setattr(fastpath, "ENABLED", packing)
    torch.manual_seed(0)
    lin = PackedLinear(16, 24)
    lin.fused_relu = True
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        out = lin(x)
    torch.testing.assert_close(out, F.relu(reference(lin, x)), atol=1e-5, rtol=1e-5)
    assert (out >= 0).all() and (out == 0).any()


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "plain"])
def test_stacked_qkv_equals_each_projection(packing, monkeypatch):
    """One product for the query, key and value projections; it follows any of them changing."""
    monkeypatch.setattr(fastpath, "ENABLED", packing)
    torch.manual_seed(0)
    plain = MultiHeadAttention(16, 2)
    packed = copy.deepcopy(plain)
    assert fastpath.apply(packed) == 4 and type(packed) is PackedMultiHeadAttention
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        for ours, theirs in zip(packed.project_qkv(x), plain.project_qkv(x)):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
        packed.v_proj.bias.add_(1)  # a change to the last projection's bias alone
        plain.v_proj.bias.add_(1)
        torch.testing.assert_close(packed.project_qkv(x)[2], plain.project_qkv(x)[2], atol=1e-5, rtol=1e-5)
    assert bool(packing) == bool(packed.q_proj._packs)
    grads = packed.project_qkv(x)  # training: the three layers, differentiable
    sum(g.sum() for g in grads).backward()
    assert all(m.weight.grad is not None for m in (packed.q_proj, packed.k_proj, packed.v_proj))


def test_eval_repacks_after_a_change_the_version_counter_misses():
    torch.manual_seed(0)
    lin = PackedLinear(16, 8).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        lin(x)
        lin.weight.data.copy_(torch.randn(8, 16))  # through .data: no version bump
        lin.eval()  # what every decoding path does first
        torch.testing.assert_close(lin(x), reference(lin, x), atol=1e-5, rtol=1e-5)


def test_forward_mode_ad_keeps_its_tangent():
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    lin = PackedLinear(16, 8)
    x, tangent = torch.randn(4, 16), torch.randn(4, 16)
    with torch.no_grad(), fwAD.dual_level():
        out = fwAD.unpack_dual(lin(fwAD.make_dual(x, tangent)))
    assert out.tangent is not None
    torch.testing.assert_close(out.tangent, tangent @ lin.weight.detach().T, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------- whole models

MODELS = {
    "transformer": TransformerConfig(arch="transformer", d_model=32, n_heads=4, enc_layers=2, dec_layers=2,
                                     d_ff=64),
    "transformer-gelu-split": TransformerConfig(arch="transformer", d_model=32, n_heads=4, enc_layers=1,
                                                dec_layers=1, d_ff=64, activation="gelu", heads="split"),
    "lstm": LSTMConfig(arch="lstm", emb_dim=16, hidden_size=16, attn_dim=16, enc_layers=1, dec_layers=1),
}


def model_and_batch(name):
    from attnmt.data.batching import collate

    torch.manual_seed(0)
    model = build_model(MODELS[name], 50, 50).eval()
    generator = torch.Generator().manual_seed(1)
    src = [torch.randint(4, 50, (n,), generator=generator).tolist() for n in (5, 9, 3)]
    tgt = [torch.randint(4, 50, (n,), generator=generator).tolist() for n in (4, 7, 6)]
    return model, collate(src, tgt)


@pytest.mark.parametrize("name", list(MODELS))
def test_a_model_with_the_fast_path_computes_what_it_computed(name):
    model, batch = model_and_batch(name)
    with torch.no_grad():
        plain = model(batch).logits
    state = {k: v.clone() for k, v in model.state_dict().items()}
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert fastpath.apply(model) > 0
    assert fastpath.apply(model) == fastpath.apply(model)  # idempotent
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.state_dict().keys() == state.keys()
    if name == "transformer":
        assert model.output.weight is model.tgt_embed.weight  # still tied
        ffn = model.encoder[0].ffn
        assert ffn[0].fused_relu and isinstance(ffn[1], nn.Identity)
    with torch.no_grad():
        packed = model(batch).logits
    torch.testing.assert_close(packed, plain, atol=1e-4, rtol=1e-4)
    fastpath.remove(model)
    assert not any(isinstance(m, (PackedLinear, PackedMultiHeadAttention)) for m in model.modules())
    assert not any(isinstance(m, nn.Identity) for m in model.modules())
    assert [m for m in model.modules() if isinstance(m, nn.ReLU)] == relus  # the very same modules
    with torch.no_grad():
        assert torch.equal(model(batch).logits, plain)  # exactly the plain products again


def test_a_model_with_the_fast_path_still_trains_like_the_plain_one():
    model, batch = model_and_batch("transformer")
    twin = copy.deepcopy(model)
    fastpath.apply(twin)
    model.train(), twin.train()
    torch.manual_seed(3)
    model(batch).logits.sum().backward()
    torch.manual_seed(3)
    twin(batch).logits.sum().backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-6, msg=name)


def test_row_counts_fall_into_few_buckets_and_padding_changes_no_row():
    """oneDNN caches a kernel per input shape: the rows are rounded up to 8 sizes per doubling (at most
    12.5% more above 64), so the shapes decoding meets stay few; the padding rows change no real row."""
    buckets = [fastpath.row_bucket(m) for m in range(1, 4097)]
    assert all(b >= m for m, b in zip(range(1, 4097), buckets))
    assert all(b <= m * 1.125 for m, b in zip(range(65, 4097), buckets[64:]))
    assert len(set(buckets)) <= 64
    torch.manual_seed(0)
    layer = fastpath.PackedLinear(16, 24)
    x = torch.randn(13, 16)  # 13 rows run as 16
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
        assert layer(x).shape == (13, 24)
