"""The kernels with state against their oracles: Linformer with k = S and E = F = identity against
``math_attention``; Performer against softmax attention as its feature count grows, and its causal and
decoding routes against the explicit normalised phi(Q) phi(K)^T; padding, refusals, and Transformers that
use them (a training step, a state_dict round trip, step-by-step decoding against teacher forcing)."""

import json

import pytest
import torch
from helpers import assert_one_error_line, run_attnmt, write_tiny_config

from attnmt.config.schema import TransformerConfig, config_from_dict, load_config
from attnmt.data.batching import collate, padding_mask
from attnmt.data.tokenizer import PAD_ID
from attnmt.decoding import ctranslate
from attnmt.errors import ConfigError
from attnmt.models import build_model
from attnmt.models.kernel_modules import (
    STANDALONE_KERNELS,
    LinformerKernel,
    PerformerKernel,
    linformer_attention,
    orthogonal_features,
    performer_attention,
    positive_feature_map,
    standalone_kernel,
)
from attnmt.models.kernels import math_attention
from attnmt.models.loss import label_smoothed_nll
from attnmt.models.masks import causal_mask, cross_mask

f64 = torch.float64


def qkv(B=2, H=2, T=7, S=9, d=4, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, d, dtype=f64, generator=generator) for n in (T, S, S))
    return q * scale, k * scale, v


def key_padding(lengths, S):
    return cross_mask(padding_mask(torch.tensor(lengths), S))  # (B, 1, 1, S)


def close(actual, expected, atol=1e-10):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ----------------------------------------------------------------------------------------- Linformer


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("T", [9, 4])
def test_linformer_with_identity_projections_is_softmax_attention(padded, T):
    S = 9
    q, k, v = qkv(T=T, S=S)
    mask = key_padding([S, S - 3], S) if padded else None
    identity = torch.eye(S, S + 3, dtype=f64)  # k = S rows; max_len beyond S: only the first S columns count
    expected, expected_weights = math_attention(q, k, v, mask)
    context, weights = linformer_attention(q, k, v, mask, need_weights=True, proj_k=identity, proj_v=identity)
    close(context, expected)
    close(weights, expected_weights)
    context, none = linformer_attention(q, k, v, mask, proj_k=identity, proj_v=identity)
    assert none is None
    close(context, expected)


def test_linformer_module_holds_its_projections():
    kernel = LinformerKernel(k=5, max_len=12).double()
    assert dict(kernel.named_parameters()).keys() == {"proj_k", "proj_v"}
    assert kernel.proj_k.shape == (5, 12)
    shared = LinformerKernel(k=5, max_len=12, share_kv=True)
    assert dict(shared.named_parameters()).keys() == {"proj_k"}
    # N(0, 1/k): the variance of many entries is about 1/k
    big = LinformerKernel(k=16, max_len=4096)
    assert abs(big.proj_k.var().item() * 16 - 1) < 0.05
    q, k, v = qkv(T=6, S=12)
    mask = key_padding([12, 7], 12)
    context, weights = kernel(q, k, v, mask, need_weights=True)
    assert context.shape == (2, 2, 6, 4) and weights.shape == (2, 2, 6, 12)
    # The implicit token weights make the context, and are 0 at padded keys.
    close(weights @ v, context)
    assert (weights[1, :, :, 7:] == 0).all()
    context.sum().backward()
    assert kernel.proj_k.grad.abs().sum() > 0 and kernel.proj_v.grad.abs().sum() > 0


def test_linformer_refuses_what_it_cannot_do():
    kernel = LinformerKernel(k=4, max_len=9).double()
    q, k, v = qkv(T=9, S=9)
    with pytest.raises(ValueError, match="cannot be causal"):
        kernel(q, k, v, causal=True)
    with pytest.raises(ValueError, match="key-padding mask"):
        kernel(q, k, v, causal_mask(9, S=9))
    q, k, v = qkv(T=10, S=10)
    with pytest.raises(ValueError, match="max_len = 9"):
        kernel(q, k, v)


# ----------------------------------------------------------------------------------------- Performer


def performer_error(m, features, n_seeds, d=16):
    """Mean absolute error of Performer's context against softmax attention, over n_seeds draws of the
    features (and of q, k, v): moderately scaled q and k, so that exp(q k / sqrt(d)) stays moderate."""
    errors = []
    for seed in range(n_seeds):
        q, k, v = qkv(T=8, S=10, d=d, seed=100 + seed, scale=0.5)
        expected, _ = math_attention(q, k, v)
        w = features(m, d, torch.Generator().manual_seed(seed)).to(f64)
        context, _ = performer_attention(q, k, v, features=w)
        errors.append((context - expected).abs().mean().item())
    return sum(errors) / len(errors)


def gaussian_features(m, d, generator):
    return torch.randn(m, d, generator=generator)


def test_performer_converges_to_softmax_attention():
    errors = [performer_error(m, orthogonal_features, n_seeds=8) for m in (16, 64, 256, 1024)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.3 * errors[0], errors


def test_orthogonal_features_estimate_better_than_independent_ones():
    for m in (16, 64, 256):
        orthogonal = performer_error(m, orthogonal_features, n_seeds=24)
        independent = performer_error(m, gaussian_features, n_seeds=24)
        assert orthogonal < independent, (m, orthogonal, independent)


def test_orthogonal_features_are_orthogonal_in_blocks():
    d, m = 6, 15  # two full blocks and a cut one
    w = orthogonal_features(m, d, torch.Generator().manual_seed(0)).double()
    assert w.shape == (m, d)
    for start in range(0, m, d):
        block = w[start : start + d]
        gram = block @ block.T
        off_diagonal = gram - torch.diag(torch.diagonal(gram))
        assert off_diagonal.abs().max() < 1e-5 * gram.diagonal().max()
    # Row norms are those of Gaussian vectors: chi with d degrees of freedom, E|w|^2 = d.
    many = orthogonal_features(4000, d, torch.Generator().manual_seed(1))
    assert abs(many.pow(2).sum(-1).mean().item() - d) < 0.3
    again = orthogonal_features(m, d, torch.Generator().manual_seed(0))
    assert torch.equal(again.double(), w)


def explicit_performer(q, k, v, features, key_mask=None, causal=False):
    """The normalised phi(Q) phi(K)^T, masked, times V: the matrix Performer applies implicitly."""
    phi_q = positive_feature_map(q, features, is_query=True)
    phi_k = positive_feature_map(k, features, is_query=False)
    similarity = phi_q @ phi_k.transpose(-2, -1)  # (B, H, T, S)
    if key_mask is not None:
        similarity = similarity.masked_fill(~key_mask, 0.0)
    if causal:
        similarity = similarity.masked_fill(~causal_mask(q.shape[-2], S=k.shape[-2]), 0.0)
    den = similarity.sum(-1, keepdim=True)
    weights = similarity / torch.where(den > 0, den, torch.ones_like(den))
    return weights @ v, weights


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("T,S", [(7, 7), (3, 9), (9, 4), (130, 130)])  # S > T: a decoding cache
def test_performer_equals_its_explicit_matrix(causal, T, S):
    q, k, v = qkv(T=T, S=S, d=4)
    kernel = PerformerKernel(d_head=4, n_features=8, seed=3).double()
    kernel.chunk_size = 16  # several chunks for the long case
    mask = key_padding([S, S - 2], S)
    expected, expected_weights = explicit_performer(q, k, v, kernel.features, mask, causal)
    context, none = kernel(q, k, v, mask, causal)
    assert none is None
    close(context, expected)
    context, weights = kernel(q, k, v, mask, causal, need_weights=True)
    close(weights, expected_weights)
    close(context, expected)


def test_performer_decoding_with_a_cache_equals_the_full_sequence():
    q, k, v = qkv(T=10, S=10)
    kernel = PerformerKernel(d_head=4, n_features=16).double()
    full, _ = kernel(q, k, v, causal=True)
    for t in range(10):
        step, _ = kernel(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1])  # the last query sees all
        close(step, full[:, :, t : t + 1])
        few, _ = kernel(q[:, :, t:], k, v, causal=True)  # T < S, end-aligned
        close(few, full[:, :, t:])


@pytest.mark.parametrize("name", ["linformer", "performer"])
def test_padded_garbage_keys_change_nothing(name):
    q, k, v = qkv(T=6, S=8)
    kernel = (LinformerKernel(5, 12) if name == "linformer" else PerformerKernel(4, 16)).double()
    mask = key_padding([8, 5], 8)
    expected, _ = kernel(q, k, v, mask)
    garbage = torch.randn(2, 2, 4, 4, dtype=f64, generator=torch.Generator().manual_seed(9)) * 100
    padded_k, padded_v = torch.cat([k, garbage], 2), torch.cat([v, -garbage], 2)
    padded_mask = torch.cat([mask, torch.zeros(2, 1, 1, 4, dtype=torch.bool)], -1)
    context, _ = kernel(q, padded_k, padded_v, padded_mask)
    close(context, expected)
    # Keys padded inside the first S also change nothing: row 1 is 5 long.
    alone, _ = kernel(q[1:], k[1:, :, :5], v[1:, :, :5])
    close(expected[1:], alone)


def test_performer_refuses_a_per_query_mask_and_keeps_its_features():
    kernel = PerformerKernel(4, 8, seed=0)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="key-padding mask"):
        kernel.double()(q, k, v, torch.ones(7, 9, dtype=torch.bool)[None, None])
    assert list(kernel.state_dict()) == ["features"]
    assert torch.equal(PerformerKernel(4, 8, seed=0).features, PerformerKernel(4, 8, seed=0).features)
    assert not torch.equal(PerformerKernel(4, 8, seed=0).features, PerformerKernel(4, 8, seed=1).features)


@pytest.mark.parametrize("causal", [False, True])
def test_performer_under_bf16_autocast_computes_in_fp32(causal):
    q, k, v = (t.float() for t in qkv(T=12, S=12, d=8))
    kernel = PerformerKernel(8, 32)
    expected, _ = kernel(q, k, v, causal=causal)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        context, _ = kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), causal=causal)
        from_fp32, _ = kernel(q, k, v, causal=causal)
    assert context.dtype == torch.bfloat16
    close(context.float(), expected, atol=0.05)  # the inputs' and the result's rounding to bf16 only
    close(from_fp32, expected, atol=1e-6)


@pytest.mark.parametrize("name", STANDALONE_KERNELS)
def test_standalone_kernels_run_at_their_length(name):
    n, d = 40, 8
    kernel = standalone_kernel(name, d, n)
    q, k, v = (t.float() for t in qkv(B=2, H=3, T=n, S=n, d=d))
    context, _ = kernel(q, k, v)
    assert context.shape == (2, 3, n, d)
    assert torch.isfinite(context).all()
    with pytest.raises(ValueError, match="unknown attention kernel"):
        standalone_kernel("nope", d, n)


# ------------------------------------------------------------------------------------ in a Transformer

V = 20
BASE = dict(arch="transformer", d_model=16, n_heads=2, enc_layers=2, dec_layers=2, d_ff=32, dropout=0.1,
            max_positions=25, linformer_k=6, performer_features=12)
MODELS = {
    "linformer/sdpa": dict(enc_kernel="linformer"),
    "performer/performer": dict(enc_kernel="performer", dec_kernel="performer", norm="post"),
}


def make_model(name, seed=0):
    torch.manual_seed(seed)
    return build_model(TransformerConfig(**BASE, **MODELS[name]), V, V, PAD_ID).double().eval()


def sentences(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, V, (n,), generator=generator).tolist() for n in lengths]


SRC, TGT = sentences([9, 5, 7], seed=1), sentences([4, 8, 2], seed=2)


def step_all(model, batch):
    state = model.encode(batch.src, batch.src_mask)
    logits = []
    for t in range(batch.tgt_in.size(1)):
        step_logits, state, _ = model.step(batch.tgt_in[:, t], state)
        logits.append(step_logits)
    return torch.stack(logits, 1)


@pytest.mark.parametrize("name", MODELS)
def test_each_layer_has_its_own_kernel_state(name):
    model = make_model(name)
    kernels = [layer.self_attn.kernel for layer in model.encoder]
    assert kernels[0] is not kernels[1]
    state = model.state_dict()
    if name.startswith("linformer"):
        assert state["encoder.0.self_attn.kernel.proj_k"].shape == (6, 25)
    else:
        assert state["decoder.1.self_attn.kernel.features"].shape == (12, 8)
        first, second = (layer.self_attn.kernel.features for layer in model.decoder)
        assert not torch.equal(first, second)
    assert model.decoder[0].cross_attn.kernel.__name__ == "sdpa_attention"


@pytest.mark.parametrize("name", MODELS)
def test_step_by_step_equals_teacher_forcing(name):
    model = make_model(name)
    batch = collate(SRC, TGT)
    with torch.no_grad():
        close(step_all(model, batch), model(batch).logits, atol=1e-9)


@pytest.mark.parametrize("name", MODELS)
def test_a_sentence_does_not_depend_on_its_batch(name):
    model = make_model(name)
    batch = collate(SRC + sentences([11], seed=3), TGT + sentences([9], seed=4))
    with torch.no_grad():
        together = model(batch).logits
        for i in range(len(SRC)):
            alone = model(collate([SRC[i]], [TGT[i]])).logits[0]
            close(together[i, : alone.size(0)], alone, atol=1e-9)


@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_and_a_state_dict_round_trip(name):
    model = make_model(name).train()
    batch = collate(SRC, TGT)
    out = label_smoothed_nll(model(batch).logits, batch.tgt_out, PAD_ID, smoothing=0.1)
    out.loss.backward()
    for param_name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), param_name
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    model.eval()
    fresh = make_model(name, seed=1)  # other weights, other projections or features
    with torch.no_grad():
        expected = model(batch).logits
        attention = model(batch, need_attention=True).attention
        assert attention["enc_self"][0].shape == (3, 2, 10, 10)
        assert not torch.allclose(fresh(batch).logits, expected)
        fresh.load_state_dict(model.state_dict())
        close(fresh(batch).logits, expected, atol=0)
        close(step_all(fresh, batch), expected, atol=1e-9)


# -------------------------------------------------------------------------------------- config, export


def test_config_keys_and_their_defaults():
    cfg = TransformerConfig(arch="transformer", enc_kernel="performer", dec_kernel="performer")
    assert (cfg.linformer_k, cfg.performer_features) == (64, 128)
    assert TransformerConfig(arch="transformer", enc_kernel="linformer").enc_kernel == "linformer"


def test_a_linformer_decoder_is_refused_with_one_line(tmp_path):
    config = write_tiny_config(tmp_path / "tiny.yaml")
    data = json.loads(config.read_text())
    data["model"]["dec_kernel"] = "linformer"
    bad = tmp_path / "bad.yaml"
    bad.write_text(json.dumps(data, indent=1))
    with pytest.raises(ConfigError) as error:
        load_config(bad)
    message = str(error.value)
    assert message.startswith(f"{bad}:") and "\n" not in message
    assert message.endswith(": model.dec_kernel: linformer cannot apply to causal decoding (it projects the "
                            "whole sequence, future included); use it as enc_kernel")
    result = run_attnmt("train", config, "--run-dir", tmp_path / "run", "--set", "model.dec_kernel=linformer")
    assert result.returncode == 2
    line = assert_one_error_line(result.stderr)
    assert line.startswith("error: --set model.dec_kernel: linformer cannot apply to causal decoding")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key, kernel", [("enc_kernel", "linformer"), ("enc_kernel", "performer"),
                                         ("dec_kernel", "performer")])
def test_ctranslate2_export_refuses_these_kernels(tmp_path, key, kernel):
    data = json.loads(write_tiny_config(tmp_path / "tiny.yaml").read_text())
    data["model"][key] = kernel
    why = ctranslate._unsupported(config_from_dict(data, base_dir=tmp_path).model)
    assert why is not None and why.startswith(f"model.{key} is {kernel}: ") and "\n" not in why
