import pytest
import torch

from attnmt.data.batching import padding_mask
from attnmt.models.masks import (
    causal_mask,
    combine_masks,
    cross_mask,
    masked_softmax,
    normalise_mask,
)


def test_padding_mask_marks_real_tokens():
    mask = padding_mask(torch.tensor([3, 1, 0]))
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[True, True, True], [True, False, False], [False, False, False]]
    assert padding_mask(torch.tensor([2]), max_len=4).tolist() == [[True, True, False, False]]


def test_causal_mask_square_is_lower_triangular():
    assert torch.equal(causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_aligns_to_the_end_of_the_keys():
    # 2 new queries after 3 cached keys: query t sits at position 3 + t.
    mask = causal_mask(2, S=5)
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    # One query (a decoding step) sees everything.
    assert causal_mask(1, S=6).all()
    # More queries than keys: the first ones see nothing.
    mask = causal_mask(4, S=2)
    assert mask.tolist() == [[False, False], [False, False], [True, False], [True, True]]


def test_cross_and_combine_masks():
    src_mask = padding_mask(torch.tensor([2, 3]))  # (2, 3)
    assert cross_mask(src_mask).shape == (2, 1, 1, 3)
    combined = combine_masks(None, cross_mask(src_mask), causal_mask(3))
    assert combined.shape == (2, 1, 3, 3)
    assert combined[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert combine_masks(None, None) is None


def test_normalise_mask_shapes():
    B, T, S = 2, 3, 4
    assert normalise_mask(torch.ones(B, S, dtype=torch.bool), B, T, S).shape == (B, 1, 1, S)
    assert normalise_mask(torch.ones(T, S, dtype=torch.bool), B, T, S).shape == (1, 1, T, S)
    assert normalise_mask(torch.ones(B, T, S, dtype=torch.bool), B, T, S).shape == (B, 1, T, S)
    assert normalise_mask(torch.ones(B, 5, T, S, dtype=torch.bool), B, T, S).shape == (B, 5, T, S)
    assert normalise_mask(None, B, T, S) is None
    # B == T is ambiguous: read as key padding, the common case.
    key_padding = torch.tensor([[True, False], [True, True]])
    assert torch.equal(normalise_mask(key_padding, 2, 2, 2)[:, 0, 0], key_padding)
    with pytest.raises(ValueError, match="fits none"):
        normalise_mask(torch.ones(5, S, dtype=torch.bool), B, T, S)
    with pytest.raises(TypeError, match="bool"):
        normalise_mask(torch.ones(B, S), B, T, S)


def test_masked_softmax_equals_softmax_over_allowed_entries():
    torch.manual_seed(0)
    scores = torch.randn(3, 6, dtype=torch.float64)
    mask = torch.rand(3, 6) > 0.4
    mask[:, 0] = True
    probs = masked_softmax(scores, mask)
    for row in range(3):
        expected = torch.zeros(6, dtype=torch.float64)
        expected[mask[row]] = torch.softmax(scores[row, mask[row]], dim=0)
        torch.testing.assert_close(probs[row], expected)
    torch.testing.assert_close(masked_softmax(scores, None), torch.softmax(scores, dim=-1))


def test_masked_softmax_broadcasts_mask_and_other_dim():
    scores = torch.randn(2, 4, 5, dtype=torch.float64)
    mask = torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(masked_softmax(scores, mask), masked_softmax(scores, mask.expand(2, 4, 5)))
    column_mask = torch.tensor([True, True, False, True])[:, None]  # (4, 1), softmax over dim 1
    probs = masked_softmax(scores, column_mask, dim=1)
    assert torch.all(probs[:, 2] == 0)
    torch.testing.assert_close(probs.sum(dim=1), torch.ones(2, 5, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fully_masked_rows_give_zeros_and_finite_gradients(dtype):
    # Large scores too: a -1e9 fill or a NaN from exp(-inf + inf) would show here.
    scores = (torch.randn(4, 5) * 1000).to(dtype).requires_grad_()
    mask = torch.tensor([True, False, True, True, False])[None, :].repeat(4, 1)
    mask[1] = False
    mask[3] = False
    probs = masked_softmax(scores, mask)
    assert torch.all(probs[1] == 0) and torch.all(probs[3] == 0)
    assert torch.all(probs[~mask] == 0)
    torch.testing.assert_close(probs[[0, 2]].float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)
    (probs * torch.randn(4, 5).to(dtype)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.all(scores.grad[1] == 0) and torch.all(scores.grad[~mask] == 0)
