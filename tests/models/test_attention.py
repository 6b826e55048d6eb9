"""The attention modules: single-query scores against their formulas, multi-head attention against
``torch.nn.MultiheadAttention``, incremental decoding against the full forward."""

import functools

import pytest
import torch
from torch import nn

from attnmt.data.batching import padding_mask
from attnmt.models.attention import SCORES, Attention, BlockDiagonalLinear, MultiHeadAttention
from attnmt.models.kernels import KERNELS, sparse_attention, sparse_pattern
from attnmt.models.masks import causal_mask, cross_mask

f64 = torch.float64


def qkv(B=2, H=2, T=7, S=9, d=4, dtype=f64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, d, dtype=dtype, generator=generator) for n in (T, S, S))


def key_padding(lengths, S):
    return cross_mask(padding_mask(torch.tensor(lengths), S))  # (B, 1, 1, S)


# ----------------------------------------------------------------- single-query scores


def test_score_registry_and_errors():
    assert set(SCORES) == {"additive", "dot", "general", "scaled_dot"}
    with pytest.raises(ValueError, match="additive, dot, general, scaled_dot"):
        Attention("concat", 4, 4, 4)
    for score in ("dot", "scaled_dot"):
        with pytest.raises(ValueError, match="query_dim == key_dim"):
            Attention(score, 4, 6, 4)
    Attention("general", 4, 6, 4)  # different sizes are what "general" is for


@pytest.mark.parametrize("score", list(SCORES))
def test_attention_scores_match_their_formulas(score):
    torch.manual_seed(0)
    B, S, D = 2, 5, 6
    attention = Attention(score, D, D, 3).double()
    query, keys, values = (
        torch.randn(B, D, dtype=f64),
        torch.randn(B, S, D, dtype=f64),
        torch.randn(B, S, 2, dtype=f64),
    )
    mask = padding_mask(torch.tensor([5, 3]))
    context, weights = attention(query, attention.project_keys(keys), values, mask)
    assert context.shape == (B, 2) and weights.shape == (B, S)
    s = attention.score
    if score == "additive":
        expected = torch.tanh(s.query_proj(query)[:, None] + s.key_proj(keys)) @ s.v.weight[0]
    elif score == "general":
        expected = torch.einsum("bq,qk,bsk->bs", query, s.key_proj.weight, keys)
    else:
        expected = torch.einsum("bd,bsd->bs", query, keys) / (D**0.5 if score == "scaled_dot" else 1)
    expected = expected.masked_fill(~mask, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights, expected)
    torch.testing.assert_close(context, torch.einsum("bs,bsv->bv", expected, values))
    # Several queries at once give the same rows.
    queries = torch.stack([query, 2 * query], dim=1)  # (B, 2, D)
    many, many_weights = attention(queries, attention.project_keys(keys), values, mask)
    torch.testing.assert_close(many[:, 0], context)
    torch.testing.assert_close(many_weights[:, 0], weights)


def test_additive_attention_gradcheck():
    torch.manual_seed(0)
    attention = Attention("additive", 3, 4, 5).double()
    mask = padding_mask(torch.tensor([4, 2]))
    inputs = (
        torch.randn(2, 3, dtype=f64, requires_grad=True),
        torch.randn(2, 4, 4, dtype=f64, requires_grad=True),
        torch.randn(2, 4, 2, dtype=f64, requires_grad=True),
    )

    def run(query, keys, values):
        return attention(query, attention.project_keys(keys), values, mask)

    assert torch.autograd.gradcheck(run, inputs)


def test_attention_ignores_extra_padding():
    torch.manual_seed(0)
    attention = Attention("additive", 4, 4, 4)
    query, keys, values = torch.randn(2, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    context, weights = attention(
        query, attention.project_keys(keys), values, padding_mask(torch.tensor([5, 3]))
    )
    keys2, values2 = torch.cat([keys, torch.randn(2, 3, 4)], 1), torch.cat([values, torch.randn(2, 3, 3)], 1)
    context2, weights2 = attention(
        query, attention.project_keys(keys2), values2, padding_mask(torch.tensor([5, 3]), 8)
    )
    torch.testing.assert_close(context2, context)
    torch.testing.assert_close(weights2[:, :5], weights)
    assert torch.all(weights2[:, 5:] == 0)


# ----------------------------------------------------------------- multi-head


def torch_mha(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    reference = nn.MultiheadAttention(ours.d_model, ours.n_heads, batch_first=True, dtype=f64)
    with torch.no_grad():
        reference.in_proj_weight.copy_(
            torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
        )
        reference.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        reference.out_proj.weight.copy_(ours.out_proj.weight)
        reference.out_proj.bias.copy_(ours.out_proj.bias)
    return reference.eval()


@pytest.mark.parametrize("kernel", ["math", "sdpa"])
@pytest.mark.parametrize("masking", ["padding", "causal", "both"])
def test_mha_equals_torch_multihead_attention(kernel, masking):
    torch.manual_seed(0)
    B, T, S, D, H = 2, 5, 5, 8, 2
    ours = MultiHeadAttention(D, H, kernel=kernel).double().eval()
    reference = torch_mha(ours)
    query, key = torch.randn(B, T, D, dtype=f64), torch.randn(B, S, D, dtype=f64)
    src_mask = padding_mask(torch.tensor([5, 3]))  # (B, S), True = real token
    use_padding, causal = masking in ("padding", "both"), masking in ("causal", "both")
    torch_kwargs = {
        "key_padding_mask": ~src_mask if use_padding else None,  # nn.MHA: True = masked
        "attn_mask": ~causal_mask(T) if causal else None,
    }
    our_mask = src_mask if use_padding else None
    out, weights = ours(query, key, key, our_mask, causal=causal, need_weights=True)
    expected, expected_avg = reference(query, key, key, **torch_kwargs, need_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights.mean(1), expected_avg)
    _, expected_heads = reference(query, key, key, **torch_kwargs, average_attn_weights=False)
    torch.testing.assert_close(weights, expected_heads)
    out2, none = ours(query, key, key, our_mask, causal=causal)
    assert none is None
    torch.testing.assert_close(out2, expected)


def test_mha_accepts_every_mask_shape():
    torch.manual_seed(0)
    B, H, T, S, D = 2, 2, 3, 4, 8
    mha = MultiHeadAttention(D, H, kernel="math").double()
    x, y = torch.randn(B, T, D, dtype=f64), torch.randn(B, S, D, dtype=f64)
    full = torch.rand(B, H, T, S) > 0.3
    src_mask = padding_mask(torch.tensor([4, 2]))
    cases = [
        (full[0, 0], full[:1, :1]),  # (T, S)
        (full[:, 0], full[:, :1]),  # (B, T, S)
        (src_mask, src_mask[:, None, None, :]),  # (B, S) key padding
        (full, full),  # (B, H, T, S)
    ]
    for mask, as_4d in cases:
        expected, _ = mha(x, y, y, as_4d.expand(B, H, T, S).contiguous())
        torch.testing.assert_close(mha(x, y, y, mask)[0], expected)


def test_mha_incremental_decoding_equals_full_forward():
    # Self-attention K/V grow one position per step; causal with T != S aligns to the end.
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, kernel="sdpa").double()
    x = torch.randn(2, 6, 8, dtype=f64)
    expected, _ = mha(x, x, x, causal=True)
    k_cache = v_cache = None
    steps = []
    for t in range(6):
        k, v = mha.project_kv(x[:, t : t + 1])
        k_cache = k if k_cache is None else torch.cat([k_cache, k], 2)
        v_cache = v if v_cache is None else torch.cat([v_cache, v], 2)
        out, _ = mha.attend(mha.project_q(x[:, t : t + 1]), k_cache, v_cache, causal=True)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), expected)


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_mha_need_weights_for_every_kernel(kernel):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, kernel=kernel).double()
    x = torch.randn(2, 6, 8, dtype=f64)
    src_mask = padding_mask(torch.tensor([6, 4]))
    out, weights = mha(x, x, x, src_mask, need_weights=True)
    assert weights.shape == (2, 2, 6, 6)
    assert torch.all(weights[1, :, :, 4:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 6, dtype=f64))
    torch.testing.assert_close(mha(x, x, x, src_mask)[0], out)


def test_mha_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, dropout=0.5, kernel="math")
    x = torch.randn(2, 6, 8)
    mha.eval()
    torch.testing.assert_close(mha(x, x, x)[0], mha(x, x, x)[0])
    mha.train()
    assert not torch.allclose(mha(x, x, x)[0], mha(x, x, x)[0])


def test_split_heads_are_block_diagonal():
    torch.manual_seed(0)
    D, H = 8, 4
    split = MultiHeadAttention(D, H, heads="split", kernel="math").double()
    full = MultiHeadAttention(D, H, heads="full", kernel="math").double()
    x = torch.randn(2, 5, D, dtype=f64)
    for name in ("q_proj", "k_proj", "v_proj"):
        projection = getattr(split, name)
        assert isinstance(projection, BlockDiagonalLinear)
        dense = nn.Linear(D, D, dtype=f64)
        with torch.no_grad():
            dense.weight.copy_(torch.block_diag(*projection.weight))
            dense.bias.copy_(projection.bias)
        torch.testing.assert_close(projection(x), dense(x))
        # Head h's output depends on input slice h only.
        y = x.clone()
        y[..., :2] += 1.0
        changed = (projection(y) - projection(x)).abs().amax(dim=(0, 1))
        assert torch.all(changed[2:] == 0) and torch.all(changed[:2] > 0)
    # Copy those dense maps into a full MHA: the same function.
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(full, name).weight.copy_(torch.block_diag(*getattr(split, name).weight))
            getattr(full, name).bias.copy_(getattr(split, name).bias)
        full.out_proj.load_state_dict(split.out_proj.state_dict())
    torch.testing.assert_close(split(x, x, x)[0], full(x, x, x)[0])
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert count(split) == 3 * (H * (D // H) ** 2 + D) + D * D + D
    assert count(split) < count(full)


def test_mha_errors_name_the_valid_choices():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(4\)"):
        MultiHeadAttention(10, 4)
    with pytest.raises(ValueError, match="math, sdpa, linear, sparse"):
        MultiHeadAttention(8, 2, kernel="flash")
    with pytest.raises(ValueError, match="full, split"):
        MultiHeadAttention(8, 2, heads="grouped")
    with pytest.raises(ValueError, match="fits none"):
        MultiHeadAttention(8, 2)(
            torch.randn(2, 3, 8),
            torch.randn(2, 4, 8),
            torch.randn(2, 4, 8),
            torch.ones(3, 3, dtype=torch.bool),
        )


def test_mha_accepts_a_kernel_callable():
    torch.manual_seed(0)
    kernel = functools.partial(sparse_attention, window=2, stride=3)
    mha = MultiHeadAttention(8, 2, kernel=kernel).double()
    x = torch.randn(1, 9, 8, dtype=f64)
    out, _ = mha(x, x, x)
    reference = MultiHeadAttention(8, 2, kernel="math").double()
    reference.load_state_dict(mha.state_dict())
    torch.testing.assert_close(out, reference(x, x, x, sparse_pattern(9, 9, 2, 3))[0])
