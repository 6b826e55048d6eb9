"""The attention kernels against their plain twins: ``sdpa`` against ``math``, ``linear`` against the explicit
normalised phi(Q) phi(K)^T, ``sparse`` against ``math`` under its pattern; masks, padding and gradients."""

import functools

import pytest
import torch
import torch.nn.functional as F

from attnmt.data.batching import padding_mask
from attnmt.models.kernels import (
    KERNELS,
    linear_attention,
    math_attention,
    sdpa_attention,
    sparse_attention,
    sparse_pattern,
)
from attnmt.models.masks import causal_mask, combine_masks, cross_mask

f64 = torch.float64


def qkv(B=2, H=2, T=7, S=9, d=4, dtype=f64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, d, dtype=dtype, generator=generator) for n in (T, S, S))


def key_padding(lengths, S):
    return cross_mask(padding_mask(torch.tensor(lengths), S))  # (B, 1, 1, S)


# ----------------------------------------------------------------- kernels


def test_kernel_registry():
    assert set(KERNELS) == {"math", "sdpa", "linear", "sparse"}


MASK_CASES = {
    "none": lambda T, S: None,
    "padding": lambda T, S: key_padding([S, S - 3], S),
    "per_query": lambda T, S: torch.rand(2, 1, T, S, generator=torch.Generator().manual_seed(1)) > 0.3,
}


@pytest.mark.parametrize("T,S", [(7, 7), (3, 9), (9, 4)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_sdpa_equals_math(case, causal, T, S):
    q, k, v = qkv(T=T, S=S)
    mask = MASK_CASES[case](T, S)
    expected, weights = math_attention(q, k, v, mask, causal)
    context, none = sdpa_attention(q, k, v, mask, causal)
    assert none is None
    torch.testing.assert_close(context, expected)
    # need_weights falls back to math
    context, weights2 = sdpa_attention(q, k, v, mask, causal, need_weights=True)
    torch.testing.assert_close(weights2, weights)


def test_math_causal_equals_explicit_lower_triangle():
    q, k, v = qkv(T=6, S=6)
    context, weights = math_attention(q, k, v, causal=True)
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(
        ~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf")
    )
    torch.testing.assert_close(weights, scores.softmax(-1))
    torch.testing.assert_close(context, scores.softmax(-1) @ v)


def explicit_linear(q, k, v, key_mask, causal):
    """The O(T S) twin: normalised phi(Q) phi(K)^T, masked, times V."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    similarity = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    allowed = combine_masks(key_mask, causal_mask(q.shape[-2], S=k.shape[-2]) if causal else None)
    if allowed is not None:
        similarity = similarity * allowed
    total = similarity.sum(-1, keepdim=True)
    weights = torch.where(total > 0, similarity / total, 0.0)
    return weights @ v, weights


@pytest.mark.parametrize("T,S", [(10, 10), (3, 10), (10, 4), (1, 10)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_linear_equals_explicit(padded, causal, T, S):
    q, k, v = qkv(T=T, S=S)
    mask = key_padding([S, S // 2], S) if padded else None
    expected, weights = explicit_linear(q, k, v, mask, causal)
    for chunk_size in (3, 4, 64):  # chunks that do and do not divide T
        context, none = linear_attention(q, k, v, mask, causal, chunk_size=chunk_size)
        assert none is None
        torch.testing.assert_close(context, expected)
    context, weights2 = linear_attention(q, k, v, mask, causal, need_weights=True)
    torch.testing.assert_close(weights2, weights)
    torch.testing.assert_close(context, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_linear_gradients_equal_explicit(causal):
    inputs = [x.requires_grad_() for x in qkv(T=6, S=8)]
    mask = key_padding([8, 5], 8)
    grads = torch.autograd.grad(linear_attention(*inputs, mask, causal, chunk_size=4)[0].sum(), inputs)
    expected = torch.autograd.grad(explicit_linear(*inputs, mask, causal)[0].sum(), inputs)
    for grad, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, want)


def test_linear_rejects_per_query_mask():
    q, k, v = qkv(T=5, S=5)
    with pytest.raises(ValueError, match="key-padding mask"):
        linear_attention(q, k, v, causal_mask(5))


def loop_pattern(T, S, window, stride, causal):
    pattern = torch.zeros(T, S, dtype=torch.bool)
    for i in range(T):
        p = i + S - T if causal else i
        for j in range(S):
            local = 0 <= p - j < window if causal else abs(p - j) < window
            summary = j % stride == stride - 1 and (p >= j or not causal)
            pattern[i, j] = local or summary
    return pattern


@pytest.mark.parametrize("T,S,window,stride", [(12, 12, 3, 4), (12, 12, 2, 5), (5, 12, 3, 3), (12, 7, 2, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_pattern_matches_its_definition(T, S, window, stride, causal):
    pattern = sparse_pattern(T, S, window, stride, causal)
    assert torch.equal(pattern, loop_pattern(T, S, window, stride, causal))


@pytest.mark.parametrize(
    "T,S,window,stride",
    [(13, 13, 3, 4), (13, 13, 4, 3), (16, 16, 2, 5), (5, 13, 3, 4), (13, 6, 2, 3), (6, 6, 2, 32),
     (6, 5, 2, 6)],
)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", list(MASK_CASES))
def test_sparse_equals_math_under_pattern(case, causal, T, S, window, stride):
    q, k, v = qkv(T=T, S=S)
    mask = MASK_CASES[case](T, S)
    pattern = sparse_pattern(T, S, window, stride, causal)
    assert not pattern.all()  # the pattern really cuts
    expected, weights = math_attention(q, k, v, combine_masks(mask, pattern))
    context, none = sparse_attention(q, k, v, mask, causal, window=window, stride=stride)
    assert none is None
    torch.testing.assert_close(context, expected)
    _, weights2 = sparse_attention(q, k, v, mask, causal, need_weights=True, window=window, stride=stride)
    torch.testing.assert_close(weights2, weights)


def test_sparse_defaults_and_partial():
    q, k, v = qkv(T=16, S=16)  # default window = stride = 4
    expected, _ = math_attention(q, k, v, sparse_pattern(16, 16, 4, 4))
    torch.testing.assert_close(sparse_attention(q, k, v)[0], expected)
    kernel = functools.partial(sparse_attention, window=2, stride=8)
    expected, _ = math_attention(q, k, v, sparse_pattern(16, 16, 2, 8, causal=True))
    torch.testing.assert_close(kernel(q, k, v, causal=True)[0], expected)


@pytest.mark.parametrize("name", list(KERNELS))
def test_fully_masked_rows_give_zeros_and_finite_gradients(name):
    q, k, v = (x.float().requires_grad_() for x in qkv(T=6, S=6))
    mask = key_padding([6, 0], 6)  # the second sentence has no key at all
    context, _ = KERNELS[name](q, k, v, mask)
    assert torch.all(context[1] == 0) and torch.isfinite(context).all()
    # Causal with more queries than keys: the first T - S queries see nothing.
    context2, _ = KERNELS[name](q, k[:, :, :4], v[:, :, :4], mask[..., :4], causal=True)
    assert torch.all(context2[:, :, :2] == 0) and torch.isfinite(context2).all()
    (context.sum() + context2.sum()).backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
    assert torch.all(q.grad[1] == 0)


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernels_ignore_extra_padded_keys(name):
    # sparse's default window and stride follow S: fix them so both calls agree.
    kernel = functools.partial(sparse_attention, window=3, stride=3) if name == "sparse" else KERNELS[name]
    q, k, v = qkv(T=6, S=6)
    extra = torch.randn(2, 2, 3, 4, dtype=f64)
    context, _ = kernel(q, k, v, key_padding([6, 4], 6))
    context2, _ = kernel(q, torch.cat([k, extra], 2), torch.cat([v, extra], 2), key_padding([6, 4], 9))
    torch.testing.assert_close(context2, context)




@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", ["none", "padding"])
def test_sdpa_in_bf16_on_the_cpu_follows_the_fp32_result(case, causal):
    """bf16 on the CPU takes the written-out products with the softmax in fp32 (faster there than SDPA's
    fused kernel): the result is the float64 one to bf16 rounding, fully masked rows included."""
    T = S = 9
    q, k, v = qkv(T=T, S=S, d=16)
    mask = MASK_CASES[case](T, S)
    expected, _ = math_attention(q, k, v, mask, causal)
    context, none = sdpa_attention(*(x.bfloat16() for x in (q, k, v)), mask, causal)
    assert none is None and context.dtype == torch.bfloat16
    torch.testing.assert_close(context.double(), expected, rtol=0.03, atol=0.03)
    # Teeth: fp32 inputs round far closer than that.
    fp32, _ = sdpa_attention(*(x.float() for x in (q, k, v)), mask, causal)
    assert (fp32.double() - expected).abs().max() < 1e-5 < (context.double() - expected).abs().max()


def test_math_softmax_runs_in_fp32_under_bf16():
    """A bf16 softmax would round the weights to 8 bits before they are normalised; in fp32 each row sums
    to 1 within bf16's own rounding of the result."""
    q, k, v = (x.bfloat16() for x in qkv(T=5, S=40, d=8))
    _, weights = math_attention(q, k, v, key_padding([40, 17], 40))
    assert weights.dtype == torch.bfloat16
    torch.testing.assert_close(weights.double().sum(-1), torch.ones(2, 2, 5, dtype=f64), rtol=0, atol=8e-3)
