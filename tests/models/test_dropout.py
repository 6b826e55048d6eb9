"""``attnmt.models.dropout``: the CPU mask (16-bit integers from numpy's SFC64, seeded by one draw from
torch's generator) keeps each element with probability 1 - p, p on a 1/65536 grid, and scales it by the
inverse, like ``F.dropout``; torch's seed decides it; the module is an ``nn.Dropout`` in every other way."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnmt.models.dropout import GRID, Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_kept_fraction_and_scale_match_f_dropout(p, dtype):
    torch.manual_seed(0)
    x = torch.ones(200_000, dtype=dtype)
    out = dropout(x, p)
    kept = out != 0
    n = x.numel()
    # The kept count is binomial(n, 1 - p): within 5 standard deviations.
    assert abs(int(kept.sum()) - n * (1 - p)) < 5 * math.sqrt(n * p * (1 - p))
    on_grid = round(p * GRID) / GRID
    assert abs(on_grid - p) <= 0.5 / GRID
    assert torch.equal(out[kept], torch.full_like(out[kept], 1 / (1 - on_grid)))  # in x's own dtype
    assert out.dtype == dtype
    reference = F.dropout(x, p)
    assert abs(float(out.float().mean()) - float(reference.float().mean())) < 0.02  # both near 1


def test_the_gradient_flows_through_the_kept_elements_only():
    torch.manual_seed(1)
    x = torch.randn(1000, requires_grad=True)
    out = dropout(x, 0.4)
    out.sum().backward()
    assert torch.equal(x.grad, (out.detach() != 0).float() * (1 / (1 - round(0.4 * GRID) / GRID)))


def test_same_seed_same_mask_and_eval_is_the_identity():
    x = torch.randn(64, 32)
    torch.manual_seed(7)
    a = dropout(x, 0.2)
    torch.manual_seed(7)
    b = dropout(x, 0.2)
    assert torch.equal(a, b) and not torch.equal(a, x)
    assert dropout(x, 0.2, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))


def test_the_module_is_an_nn_dropout_that_follows_train_and_eval():
    module = Dropout(0.25)
    assert isinstance(module, nn.Dropout) and module.p == 0.25 and repr(module) == repr(nn.Dropout(0.25))
    assert module.state_dict() == {}
    x = torch.ones(10_000)
    torch.manual_seed(3)
    assert (module(x) == 0).any()
    module.eval()
    assert torch.equal(module(x), x)


def test_the_mask_is_uniform_over_its_grid_and_unbiased():
    torch.manual_seed(5)
    keep, scale = keep_mask((400, 1000), 0.2)
    assert keep.shape == (400, 1000) and keep.dtype == torch.bool
    on_grid = round(0.2 * GRID) / GRID
    assert scale == 1 / (1 - on_grid)  # E[keep * scale] = 1 exactly
    n = keep.numel()
    assert abs(int(keep.sum()) - n * (1 - on_grid)) < 5 * math.sqrt(n * on_grid * (1 - on_grid))
    # Every row and column sees the same rate (no stripe from the words' four 16-bit parts).
    by_part = keep.flatten().view(-1, 4).float().mean(0)
    assert torch.allclose(by_part, torch.full((4,), 1 - on_grid), atol=0.005)
    torch.manual_seed(5)
    assert torch.equal(keep_mask((400, 1000), 0.2)[0], keep)
    assert not torch.equal(keep_mask((400, 1000), 0.2)[0], keep)  # the next draw is another mask
