"""Attention rollout and flow (``rollout.py``) against their oracles: identity attentions roll out to the
identity, every row is a distribution, on one decoder layer the flow is what a single path carries, and on
random layered attentions every maximum flow is networkx's (Boykov-Kolmogorov on the whole network, in
floating point: the code path flow had before scipy) to the bound the integer capacities allow."""

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


def networkx_flows(enc_self, dec_self, cross) -> tuple[np.ndarray, int]:
    """((T, S + T) maximum flows, the network's edge count) by networkx on the whole layered network, one
    problem per (prediction, input) pair: the oracle, written from the paper's description, not from
    ``rollout.py``'s pruned networks."""
    import networkx as nx
    from networkx.algorithms.flow import boykov_kolmogorov

    graph = nx.DiGraph()
    Le = len(enc_self)
    for layer, attention in enumerate(enc_self):
        add_block(graph, ro.mixing(attention), ("e", layer + 1), ("e", layer))
    for layer, (self_layer, cross_layer) in enumerate(zip(dec_self, cross)):
        add_block(graph, ro.mixing(self_layer), ("m", layer + 1), ("d", layer))
        attended = cross_layer.mean(0)
        T, S = attended.shape
        for t in range(T):
            graph.add_edge(("d", layer + 1, t), ("m", layer + 1, t), capacity=0.5)
        add_block(graph, 0.5 * attended, ("d", layer + 1), ("e", Le))
    found = np.zeros((T, S + T))
    for t in range(T):
        start = ("d", len(dec_self), t)
        reach = nx.descendants(graph, start)
        for k in range(S + T):
            end = ("e", 0, k) if k < S else ("d", 0, k - S)
            if end in reach:
                found[t, k] = boykov_kolmogorov(graph, start, end).graph["flow_value"]
    return found, graph.number_of_edges()


def add_block(graph, weights: np.ndarray, upper: tuple, lower: tuple) -> None:
    for i, j in zip(*np.nonzero(weights)):
        graph.add_edge((*upper, int(i)), (*lower, int(j)), capacity=float(weights[i, j]))


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


def sparse_attention(rng, heads: int, rows: int, cols: int, causal: bool) -> np.ndarray:
    """Attention with about a third of its weights zero (a piece some row never reads, an input some
    prediction cannot reach), rows still distributions; causal rows read their prefix only."""
    a = rng.random((heads, rows, cols)) * (rng.random((heads, rows, cols)) > 0.35)
    if causal:
        a = np.tril(a)
    a[..., np.arange(rows), np.minimum(np.arange(rows), cols - 1)] += 1e-3  # no empty row, causal or not
    return a / a.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed", range(24))
def test_every_maximum_flow_is_networkx_s(seed):
    """Random shapes (0 to 3 encoder layers, 1 to 3 decoder layers, 1 to 7 pieces a side), dense or sparse,
    causal or not: each of the T (S + T) maximum flows within the rounding bound E 2^-31 of networkx's (E
    the edges), and the normalised rows within 1e-6."""
    rng = np.random.default_rng(seed)
    S, T = int(rng.integers(1, 8)), int(rng.integers(1, 8))
    Le, Ld = int(rng.integers(0, 4)), int(rng.integers(1, 4))
    causal, make = bool(seed % 2), (sparse_attention if seed % 3 else random_attention)
    enc = [make(rng, 2, S, S, False) for _ in range(Le)]
    dec = [make(rng, 2, T, T, causal) for _ in range(Ld)]
    cross = [make(rng, 2, T, S, False) for _ in range(Ld)]
    expected, edges = networkx_flows(enc, dec, cross)
    found = ro.max_flows(enc, dec, cross) / ro.SCALE
    np.testing.assert_allclose(found, expected, rtol=0, atol=edges * 2.0**-31)
    assert (expected > 0).any()
    source, prefix = ro.flow(enc, dec, cross)
    normalised = expected / expected.sum(1, keepdims=True)
    np.testing.assert_allclose(np.hstack([source, prefix]), normalised, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layers, S, T", [((0, 1), 3, 4), ((1, 2), 5, 3), ((3, 2), 4, 6)])
def test_the_estimate_prices_the_problems_and_edges_flow_solves(monkeypatch, layers, S, T):
    """``flow_seconds`` (what ``plot --flow`` refuses by) is priced from the max-flow problems ``flow``
    solves and the edges of each one's network: counted here as scipy is called, on dense attention with
    a causal decoder."""
    import scipy.sparse.csgraph as csgraph

    edges: list[int] = []
    solve = csgraph.maximum_flow

    def counted(graph, source, sink, **options):
        edges.append(graph.nnz)
        return solve(graph, source, sink, **options)

    monkeypatch.setattr(csgraph, "maximum_flow", counted)
    rng = np.random.default_rng(0)
    Le, Ld = layers
    ro.flow([random_attention(rng, 2, S, S) for _ in range(Le)],
            [random_attention(rng, 2, T, T, causal=True) for _ in range(Ld)],
            [random_attention(rng, 2, T, S) for _ in range(Ld)])
    assert len(edges) == T * S + T * (T + 1) // 2
    priced = ro.SECONDS_PER_PROBLEM * len(edges) + ro.SECONDS_PER_EDGE * sum(edges)
    assert ro.flow_seconds(S, T, Le, Ld) == pytest.approx(priced, rel=1e-12)
