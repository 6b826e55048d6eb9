"""attnmt.linear.Linear against F.linear: the prepacked oneDNN path is the same product, follows weight
changes, stays out of the state_dict and out of training, and computes each row on its own."""

import copy

import pytest
import torch
import torch.nn.functional as F

from attnmt import linear
from attnmt.linear import Linear

needs_packing = pytest.mark.skipif(not linear.ENABLED, reason="this PyTorch build has no oneDNN linear ops")


def reference(lin: Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)


@needs_packing
@pytest.mark.parametrize("shape", [(7, 16), (3, 5, 16), (2, 3, 4, 16)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_packed_path_equals_f_linear(shape, bias):
    torch.manual_seed(0)
    lin = Linear(16, 24, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        out = lin(x)
    assert lin._packs  # the packed path ran
    assert out.shape == (*shape[:-1], 24)
    torch.testing.assert_close(out, reference(lin, x), atol=1e-5, rtol=1e-5)


@needs_packing
def test_non_contiguous_input_and_inference_mode():
    torch.manual_seed(0)
    lin = Linear(16, 8)
    x = torch.randn(5, 3, 16)[:, 1]  # (5, 16), rows 48 floats apart
    with torch.inference_mode():
        out = lin(x)
    torch.testing.assert_close(out, reference(lin, x.detach()), atol=1e-5, rtol=1e-5)


@needs_packing
def test_a_changed_weight_is_packed_again():
    torch.manual_seed(0)
    lin = Linear(16, 8)
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


@needs_packing
def test_each_row_is_computed_alone():
    """A row's result does not depend on the rows beside it (bitwise), so a sentence's translation
    does not depend on its batch; MKL's sgemm behind F.linear does not promise that."""
    torch.manual_seed(0)
    lin = Linear(256, 1000)
    x = torch.randn(320, 256)
    with torch.no_grad():
        full = lin(x)
        for rows in (slice(0, 1), slice(100, 101), slice(0, 64), slice(5, 12), slice(319, 320)):
            assert torch.equal(lin(x[rows]), full[rows])


def test_training_and_other_dtypes_use_f_linear():
    torch.manual_seed(0)
    lin = Linear(16, 8)
    x = torch.randn(4, 16)
    out = lin(x)  # grad enabled: the plain path, differentiable
    assert not lin._packs and out.requires_grad
    out.sum().backward()
    assert lin.weight.grad is not None
    double = Linear(16, 8).double()
    with torch.no_grad():
        assert torch.equal(double(x.double()), reference(double, x.double()))
    assert not double._packs


def test_switch_off_gives_f_linear_exactly(monkeypatch):
    monkeypatch.setattr(linear, "ENABLED", False)
    torch.manual_seed(0)
    lin = Linear(16, 8)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(lin(x), reference(lin, x))
    assert not lin._packs


@needs_packing
def test_packed_copy_stays_out_of_state_dict_and_copies():
    lin = Linear(16, 8)
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
        lin = Linear(16, 8)  # an inference tensor weight: no version counter
        x = torch.randn(4, 16)
        out, expected = lin(x), reference(lin, x)
        lin.weight.mul_(2)  # allowed in inference mode, and must be seen
        twice, expected_twice = lin(x), reference(lin, x)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(twice, expected_twice, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, twice)


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "plain"])
def test_fused_relu_equals_relu_of_the_product(packing, monkeypatch):
    monkeypatch.setattr(linear, "ENABLED", packing and linear.ENABLED)
    torch.manual_seed(0)
    lin = Linear(16, 24)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        out = lin(x, relu=True)
    torch.testing.assert_close(out, F.relu(reference(lin, x)), atol=1e-5, rtol=1e-5)
    assert (out >= 0).all() and (out == 0).any()


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "plain"])
def test_stacked_equals_each_layer(packing, monkeypatch):
    """stacked([q, k, v], x) is the three products; the stacked weight follows any of them changing."""
    monkeypatch.setattr(linear, "ENABLED", packing and linear.ENABLED)
    torch.manual_seed(0)
    layers = [Linear(16, 8), Linear(16, 12, bias=False), Linear(16, 8)]
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        outs = linear.stacked(layers, x)
        for layer, out in zip(layers, outs):
            torch.testing.assert_close(out, reference(layer, x), atol=1e-5, rtol=1e-5)
        layers[2].bias.add_(1)  # a change to the last layer's bias alone
        changed = linear.stacked(layers, x)
        torch.testing.assert_close(changed[2], reference(layers[2], x), atol=1e-5, rtol=1e-5)
    assert [o.shape[-1] for o in outs] == [8, 12, 8]
    with torch.enable_grad():  # training: the layers themselves, differentiable
        grads = linear.stacked(layers, x)
        sum(g.sum() for g in grads).backward()
    assert all(m.weight.grad is not None for m in layers)



@needs_packing
def test_eval_repacks_after_a_change_the_version_counter_misses():
    torch.manual_seed(0)
    lin = Linear(16, 8).eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        lin(x)
        lin.weight.data.copy_(torch.randn(8, 16))  # through .data: no version bump
        lin.eval()  # what every decoding path does first
        torch.testing.assert_close(lin(x), reference(lin, x), atol=1e-5, rtol=1e-5)


@needs_packing
def test_forward_mode_ad_keeps_its_tangent():
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    lin = Linear(16, 8)
    x, tangent = torch.randn(4, 16), torch.randn(4, 16)
    with torch.no_grad(), fwAD.dual_level():
        out = fwAD.unpack_dual(lin(fwAD.make_dual(x, tangent)))
    assert out.tangent is not None
    torch.testing.assert_close(out.tangent, tangent @ lin.weight.detach().T, atol=1e-5, rtol=1e-5)
