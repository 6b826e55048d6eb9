"""label_smoothed_nll against the formula written out by hand (Szegedy et al. 2016, sec. 7).

Letters: B batch, T target length, V vocabulary.
"""

import numpy as np
import pytest
import torch

from attnmt.models.loss import label_smoothed_nll

V = 20
B, T = 4, 6
# The loss runs its log-softmax in fp32 (loss.py); the oracle below runs in fp64.
TOL = dict(atol=1e-4, rtol=1e-6)


def example(pad_id=0, seed=0):
    """logits (B, T, V) fp64; target (B, T) with rows of 6, 4, 1 and 3 real tokens, then pad."""
    generator = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(B, T, V, dtype=torch.float64, generator=generator)
    target = torch.randint(0, V, (B, T), generator=generator)
    target[target == pad_id] = (pad_id + 1) % V  # real tokens are never pad
    lengths = torch.tensor([6, 4, 1, 3])
    target[torch.arange(T)[None, :] >= lengths[:, None]] = pad_id
    return logits, target


def oracle(logits, target, pad_id, smoothing):
    """Sum over non-pad (b, t) of (1 - eps) (-log p_y) + eps mean_v (-log p_v), and the plain nll sum."""
    loss = nll = torch.zeros((), dtype=torch.float64)
    for b in range(logits.size(0)):
        for t in range(logits.size(1)):
            y = int(target[b, t])
            if y == pad_id:
                continue
            log_p = logits[b, t] - logits[b, t].exp().sum().log()  # (V,)
            nll = nll - log_p[y]
            loss = loss + (1 - smoothing) * -log_p[y] + smoothing * -log_p.mean()
    return loss, nll


@pytest.mark.parametrize("pad_id", [0, 5])
def test_no_smoothing_is_the_summed_negative_log_likelihood(pad_id):
    logits, target = example(pad_id)
    out = label_smoothed_nll(logits, target, pad_id)
    expected, expected_nll = oracle(logits, target, pad_id, 0.0)
    torch.testing.assert_close(expected, expected_nll)
    torch.testing.assert_close(out.loss.double(), expected, **TOL)
    torch.testing.assert_close(out.nll.double(), expected, **TOL)
    assert out.n_tokens == 6 + 4 + 1 + 3
    assert isinstance(out.n_tokens, int)


@pytest.mark.parametrize("smoothing", [0.1, 0.3, 1.0])
def test_label_smoothing_matches_the_formula(smoothing):
    logits, target = example()
    out = label_smoothed_nll(logits, target, 0, smoothing)
    expected, expected_nll = oracle(logits, target, 0, smoothing)
    torch.testing.assert_close(out.loss.double(), expected, **TOL)
    torch.testing.assert_close(out.nll.double(), expected_nll, **TOL)  # the nll stays unsmoothed
    assert out.n_tokens == 14


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_gradient_is_softmax_minus_smoothed_target(smoothing):
    """d loss / d logits = p - (1 - eps) onehot(y) - eps / V at real positions, 0 at pad positions."""
    logits, target = example()
    logits.requires_grad_(True)
    out = label_smoothed_nll(logits, target, 0, smoothing)
    out.loss.backward()
    assert not out.nll.requires_grad
    p = logits.detach().softmax(-1)  # (B, T, V)
    onehot = torch.nn.functional.one_hot(target, V).double()
    expected = (p - (1 - smoothing) * onehot - smoothing / V) * (target != 0)[..., None]
    torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=0)


def test_pad_positions_contribute_nothing():
    logits, target = example()
    pad = target == 0  # (B, T)
    assert pad.any()
    noisy = logits.clone()
    noisy[pad] = 1e3 * torch.randn(int(pad.sum()), V, dtype=torch.float64)
    for smoothing in (0.0, 0.2):
        a = label_smoothed_nll(logits, target, 0, smoothing)
        b = label_smoothed_nll(noisy, target, 0, smoothing)
        assert torch.equal(a.loss, b.loss) and torch.equal(a.nll, b.nll) and a.n_tokens == b.n_tokens


def test_all_pad_gives_zero_and_no_tokens():
    logits, _ = example()
    out = label_smoothed_nll(logits, torch.zeros(B, T, dtype=torch.long), 0, 0.1)
    assert out.loss.item() == 0.0 and out.nll.item() == 0.0 and out.n_tokens == 0


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_sum_is_additive_over_batch_splits(smoothing):
    """Sums, not means: two half batches add up to the whole, even padded to their own widths."""
    logits, target = example()
    whole = label_smoothed_nll(logits, target, 0, smoothing)
    first = label_smoothed_nll(logits[:2], target[:2], 0, smoothing)
    width = int((target[2:] != 0).sum(1).max())  # the second half alone is only 3 wide
    second = label_smoothed_nll(logits[2:, :width], target[2:, :width], 0, smoothing)
    torch.testing.assert_close(whole.loss, first.loss + second.loss, atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(whole.nll, first.nll + second.nll, atol=1e-4, rtol=1e-6)
    assert whole.n_tokens == first.n_tokens + second.n_tokens


def test_low_precision_logits_give_an_fp32_loss():
    logits, target = example()
    half = logits.bfloat16()
    out = label_smoothed_nll(half, target, 0, 0.1)
    assert out.loss.dtype == torch.float32
    expected, _ = oracle(half.double(), target, 0, 0.1)
    torch.testing.assert_close(out.loss.double(), expected, **TOL)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_loss_and_gradient_equal_f_cross_entropys(smoothing):
    """The one-log-softmax loss and its gradient against ``F.cross_entropy(label_smoothing=...)`` (the
    oracle, in float64), padded rows left out."""
    logits, target = example()
    logits.requires_grad_(True)
    out = label_smoothed_nll(logits, target, 0, smoothing)
    (grad,) = torch.autograd.grad(out.loss, logits)
    reference = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0,
                                                  reduction="sum", label_smoothing=smoothing)
    (expected,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(out.loss.double(), reference.detach(), **TOL)
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)


def test_bf16_logits_get_a_bf16_gradient_and_huge_pad_rows_stay_out():
    logits, target = example()
    logits[target == 0] = 1e30  # what a padded row holds does not matter
    half = logits.bfloat16().requires_grad_(True)
    out = label_smoothed_nll(half, target, 0, 0.1)
    out.loss.backward()
    assert half.grad.dtype == torch.bfloat16 and torch.isfinite(half.grad).all()
    assert torch.isfinite(out.loss) and torch.all(half.grad[target == 0] == 0)


# ------------------------------------------------------------------------------- guided alignment


def _attention(seed=0, B=2, H=3, T=4, S=5):
    """Attention logits (B, H, T, S) needing grad, and their softmax."""
    logits = torch.randn(B, H, T, S, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    logits.requires_grad_(True)
    return logits, logits.softmax(-1)


def test_guided_loss_is_the_cross_entropy_of_the_chosen_heads_average_with_the_links():
    from attnmt.data.batching import alignment_targets
    from attnmt.models.loss import guided_alignment_loss

    logits, weights = _attention()
    # Pair 0: target piece 0 -> source 1; piece 2 -> sources 3 and 4 (half each). Pair 1: piece 1 -> 0.
    target = alignment_targets([np.array([[0, 1], [2, 3], [2, 4]]), np.array([[1, 0]])], 4, 5).double()
    assert target[0, 2].tolist() == [0, 0, 0, 0.5, 0.5] and target[0, 1].sum() == 0
    loss = guided_alignment_loss(weights, target, [0, 2])
    mean = (weights[:, 0] + weights[:, 2]) / 2
    by_hand = -(torch.log(mean[0, 0, 1]) + 0.5 * torch.log(mean[0, 2, 3]) + 0.5 * torch.log(mean[0, 2, 4])
                + torch.log(mean[1, 1, 0]))
    torch.testing.assert_close(loss.double(), by_hand)


def test_guided_loss_gradient_pulls_the_chosen_heads_towards_the_links_and_leaves_the_others():
    from attnmt.data.batching import alignment_targets
    from attnmt.models.loss import guided_alignment_loss

    logits, weights = _attention(1)
    links = [np.array([[0, 1], [1, 3], [3, 0]]), np.array([[2, 2]])]
    target = alignment_targets(links, 4, 5).double()
    loss = guided_alignment_loss(weights, target, [1])
    loss.backward()
    grad = logits.grad
    assert torch.count_nonzero(grad[:, [0, 2]]) == 0  # heads not chosen: no gradient at all
    # A step down the gradient raises the weight of every linked cell of the chosen head ...
    stepped = (logits - 0.5 * grad).softmax(-1)
    for b, pairs in enumerate(links):
        for t, s in pairs:
            assert stepped[b, 1, t, s] > weights[b, 1, t, s]
    # ... and leaves rows without a link (pair 0 piece 2, pair 1 pieces 0, 1, 3) alone.
    assert torch.count_nonzero(grad[0, 1, 2]) == 0 and torch.count_nonzero(grad[1, 1, [0, 1, 3]]) == 0
    # The loss falls after the step.
    assert guided_alignment_loss(stepped, target, [1]) < loss
