"""Attention rollout and attention flow (Abnar and Zuidema 2020, "Quantifying Attention Flow in
Transformers"), for an encoder-decoder: how much each source piece and each decoder input reaches each
prediction when attention is followed through every layer.

Letters: S source length (pieces + EOS), T target length (the decoder's inputs; also the predictions), H
heads. Inputs are one sentence pair's attention as ``teacher_forced_attention`` gives it: per layer
``enc_self`` (H, S, S), ``dec_self`` (H, T, T), ``cross`` (H, T, S); heads are averaged.

Each attention block has a residual connection, so (as Abnar and Zuidema do) a block's mixing is
0.5 A + 0.5 I: half of each position's information stays where it was.

- **Rollout** multiplies the mixings, layer by layer: the encoder's compose into R_enc (S, S); a decoder
  row starts at its own input, a self-attention block mixes the rows over the prefix, and a
  cross-attention block keeps half of each row and spreads the other half over the encoder outputs by the
  cross-attention (each output carrying its R_enc row). Every row stays a distribution over the source
  pieces and the decoder inputs (``rollout``).
- **Flow** reads the same layered graph (a node per position per layer, edge capacities the mixing
  weights) as a flow network: a prediction's flow to an input is the maximum flow from the prediction's
  node to that input's node (networkx's Boykov-Kolmogorov on one residual network built once, one
  problem per pair), and each row is
  normalised to sum to 1 (``flow``). It takes one max-flow problem per (prediction, input) pair, so it is
  far slower than rollout: use it on a few sentences.

Oracle: with identity attention everywhere, the encoder's rollout is the identity, and a decoder row
reaches its own input and the source position of the same index only (``tests/insight/test_rollout.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mixing(attention: np.ndarray) -> np.ndarray:
    """A block's mixing with its residual: 0.5 A + 0.5 I, from (H, rows, cols) heads (averaged) or (rows,
    cols); A square."""
    a = np.asarray(attention, dtype=np.float64)
    a = a.mean(0) if a.ndim == 3 else a
    return 0.5 * a + 0.5 * np.eye(a.shape[0])


def encoder_rollout(enc_self: Sequence[np.ndarray]) -> np.ndarray:
    """(S, S): row i, the shares of the source pieces in encoder output i, through every encoder layer."""
    rolled = None
    for layer in enc_self:
        step = mixing(layer)
        rolled = step if rolled is None else step @ rolled
    return rolled


def rollout(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray],
            cross: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(source (T, S), prefix (T, T)): each prediction's shares of the source pieces and of the decoder's
    inputs, rolled out through every layer; each row sums to 1 over both."""
    source_mix = encoder_rollout(enc_self)
    T, S = np.asarray(cross[0]).shape[-2:]
    if source_mix is None:
        source_mix = np.eye(S)
    shares = np.hstack([np.zeros((T, S)), np.eye(T)])  # (T, S + T)
    for self_layer, cross_layer in zip(dec_self, cross):
        shares = mixing(self_layer) @ shares
        attended = np.asarray(cross_layer, dtype=np.float64)
        attended = attended.mean(0) if attended.ndim == 3 else attended  # (T, S)
        shares = 0.5 * shares
        shares[:, :S] += 0.5 * attended @ source_mix
    return shares[:, :S], shares[:, S:]


def _graph(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray], cross: Sequence[np.ndarray]):
    """The layered flow network: nodes ("e", layer, i) for the encoder, ("d", layer, t) after each decoder
    layer, ("m", layer, t) between a decoder layer's self- and cross-attention; edges point from a layer's
    outputs to its inputs, with the mixing weights as capacities."""
    import networkx as nx

    graph = nx.DiGraph()
    Le = len(enc_self)
    for layer, attention in enumerate(enc_self):
        _edges(graph, mixing(attention), ("e", layer + 1), ("e", layer))
    for layer, (self_layer, cross_layer) in enumerate(zip(dec_self, cross)):
        _edges(graph, mixing(self_layer), ("m", layer + 1), ("d", layer))
        attended = np.asarray(cross_layer, dtype=np.float64)
        attended = attended.mean(0) if attended.ndim == 3 else attended
        T, S = attended.shape
        for t in range(T):
            graph.add_edge(("d", layer + 1, t), ("m", layer + 1, t), capacity=0.5)
            for s in range(S):
                if attended[t, s] > 0:
                    graph.add_edge(("d", layer + 1, t), ("e", Le, s), capacity=0.5 * attended[t, s])
    return graph


def _edges(graph, weights: np.ndarray, upper: tuple, lower: tuple) -> None:
    rows, cols = np.nonzero(weights)
    for i, j in zip(rows.tolist(), cols.tolist()):
        graph.add_edge((*upper, i), (*lower, j), capacity=float(weights[i, j]))


def flow(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray],
         cross: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(source (T, S), prefix (T, T)): each prediction's maximum flow to each source piece and each decoder
    input, each row normalised to sum to 1 over both."""
    import networkx as nx
    from networkx.algorithms.flow import boykov_kolmogorov, build_residual_network

    graph = _graph(enc_self, dec_self, cross)
    residual = build_residual_network(graph, "capacity")  # built once; each problem resets its flows
    T, S = np.asarray(cross[0]).shape[-2:]
    Ld = len(dec_self)
    found = np.zeros((T, S + T))
    for t in range(T):
        start = ("d", Ld, t)
        reach = nx.descendants(graph, start)
        for k in range(S + T):
            end = ("e", 0, k) if k < S else ("d", 0, k - S)
            if end in reach:
                found[t, k] = boykov_kolmogorov(graph, start, end, residual=residual).graph["flow_value"]
    total = found.sum(1, keepdims=True)
    found = np.divide(found, total, out=np.zeros_like(found), where=total > 0)
    return found[:, :S], found[:, S:]
