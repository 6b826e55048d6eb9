"""Attention rollout and flow (``rollout.py``) against their oracles: identity attentions roll out to the
identity, every row is a distribution, and on one decoder layer the flow is what a single path carries."""

from __future__ import annotations

import numpy as np
import pytest

from attnmt.insight import rollout as ro


def random_attention(rng, heads: int, rows: int, cols: int, causal: bool = False) -> np.ndarray:
    a = rng.random((heads, rows, cols)) + 1e-3
    if causal:
        a = np.tril(a)
    return a / a.sum(-1, keepdims=True)


def pair(seed: int = 0, S: int = 5, T: int = 4, layers: int = 2):
    rng = np.random.default_rng(seed)
    return ([random_attention(rng, 2, S, S) for _ in range(layers)],
            [random_attention(rng, 2, T, T, causal=True) for _ in range(layers)],
            [random_attention(rng, 2, T, S) for _ in range(layers)])


def test_rollout_of_identity_attentions_is_the_identity():
    S = 4
    eye = [np.eye(S)[None].repeat(2, 0) for _ in range(3)]
    np.testing.assert_allclose(ro.encoder_rollout(eye), np.eye(S))
    source, prefix = ro.rollout(eye, eye, eye)
    # each prediction reaches its own decoder input and the source piece of its own index only
    assert np.count_nonzero(source - np.diag(np.diag(source))) == 0
    assert np.count_nonzero(prefix - np.diag(np.diag(prefix))) == 0
    np.testing.assert_allclose(np.diag(source) + np.diag(prefix), 1.0)
    np.testing.assert_allclose(np.diag(prefix), 0.5 ** 3)  # half stays at each of the three cross blocks


@pytest.mark.parametrize("method", [ro.rollout, ro.flow])
def test_rows_are_distributions_and_the_future_gets_nothing(method):
    enc, dec, cross = pair()
    source, prefix = method(enc, dec, cross)
    assert (source >= 0).all() and (prefix >= 0).all()
    np.testing.assert_allclose(source.sum(1) + prefix.sum(1), 1.0)
    assert np.count_nonzero(np.triu(prefix, 1)) == 0


def test_flow_on_one_decoder_layer_is_what_one_path_carries():
    """No encoder layer, one decoder layer: from prediction t, the only path to decoder input k runs
    through the residual edge (0.5) and then the self-attention mixing (0.5 A + 0.5 I)[t, k], so the flow is
    the smaller of the two; to source piece s, the one cross edge, 0.5 A_cross[t, s]."""
    rng = np.random.default_rng(1)
    dec, cross = random_attention(rng, 1, 4, 4, causal=True), random_attention(rng, 1, 4, 5)
    source, prefix = ro.flow([], [dec], [cross])
    raw = np.hstack([0.5 * cross[0], np.minimum(0.5, ro.mixing(dec))])
    expected = raw / raw.sum(1, keepdims=True)
    np.testing.assert_allclose(np.hstack([source, prefix]), expected, atol=1e-9)
