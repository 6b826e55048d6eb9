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
  node to that input's node, and each row is normalised to sum to 1 (``flow``). That is one max-flow
  problem per (prediction, input) pair, each solved by scipy's compiled Dinic on integer capacities (within
  E 2^-31 of the exact flow, E the edges) on the smallest network that holds its paths (``max_flows``).
  The work grows as the fourth power of the sentence's length; ``flow_seconds`` estimates it from the
  lengths and layers alone, before any model work, so that a command can refuse a page it cannot draw
  in the time it promises.

Oracles (``tests/insight/test_rollout.py``): with identity attention everywhere, the encoder's rollout is
the identity, and a decoder row reaches its own input and the source position of the same index only; on
random layered attentions every maximum flow is networkx's Boykov-Kolmogorov on the whole network.
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


def _heads(attention) -> np.ndarray:
    a = np.asarray(attention, dtype=np.float64)
    return a.mean(0) if a.ndim == 3 else a


# Capacities (each at most 1) become integers for scipy's max-flow: scaled by 2^30, rounded, so every
# capacity and every flow (at most the source's out-capacity, 1) fits in int32. Each rounded capacity is
# within 2^-31 of its own, so a cut of k edges is within k 2^-31, and each maximum flow within E 2^-31
# of the exact one (E the network's edges; under 1e-4 for a pair of 200 pieces each on 2 + 2 layers).
SCALE = 2**30

Edges = tuple[np.ndarray, np.ndarray, np.ndarray]  # (from nodes, to nodes, capacities)


def _block(weights: np.ndarray, upper: int, lower: int) -> Edges:
    """A layer's edges from node ``upper + i`` to node ``lower + j`` with capacity weights[i, j] > 0."""
    rows, cols = np.nonzero(weights)
    return upper + rows, lower + cols, weights[rows, cols]


def _csr(size: int, blocks: Sequence[Edges]):
    """The network of ``blocks`` as scipy's integer capacity matrix (size, size)."""
    from scipy.sparse import csr_array

    rows, cols, caps = (np.concatenate(part) for part in zip(*blocks))
    caps = np.rint(caps * SCALE).astype(np.int32)
    keep = caps > 0
    return csr_array((caps[keep], (rows[keep], cols[keep])), shape=(size, size))


def _network(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray], cross: Sequence[np.ndarray]):
    """The layered flow network as edge blocks: (decoder, crossing, encoder). Edges point from a layer's
    outputs to its inputs, with the mixing weights as capacities. Nodes, decoder first: d_l (after decoder
    layer l; d_0 the inputs) at 2 l T + t, m_l (between layer l's self- and cross-attention) at (2 l - 1) T +
    t, then e_l (after encoder layer l; e_0 the source pieces) at (2 Ld + 1) T + l S + s."""
    T, S = np.asarray(cross[0]).shape[-2:]
    encoder_base = (2 * len(dec_self) + 1) * T
    decoder, crossing = [], []
    for layer, (self_layer, cross_layer) in enumerate(zip(dec_self, cross)):
        middle = (2 * layer + 1) * T  # m_{layer+1}; d_{layer+1} follows it
        decoder.append(_block(mixing(self_layer), middle, 2 * layer * T))
        decoder.append(_block(0.5 * np.eye(T), middle + T, middle))  # the residual half stays
        crossing.append(_block(0.5 * _heads(cross_layer), middle + T, encoder_base + len(enc_self) * S))
    encoder = [_block(mixing(attention), encoder_base + (layer + 1) * S, encoder_base + layer * S)
               for layer, attention in enumerate(enc_self)]
    return decoder, crossing, encoder


def max_flows(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray],
              cross: Sequence[np.ndarray]) -> np.ndarray:
    """(T, S + T) int64: each prediction's maximum flow to each source piece, then to each decoder input,
    in units of 1 / ``SCALE``: scipy's Dinic, one problem per (prediction, input) pair, each on the
    smallest network that holds its paths.

    - To a decoder input: the decoder alone (no path that enters the encoder comes back), and only the
      inputs the prediction reaches (its prefix, when the self-attention is causal).
    - To source piece s: one network per s, its first encoder layer cut to the edges into s (the other
      pieces of that layer reach no sink)."""
    from scipy.sparse.csgraph import breadth_first_order, maximum_flow

    T, S = np.asarray(cross[0]).shape[-2:]
    decoder, crossing, encoder = _network(enc_self, dec_self, cross)
    starts = 2 * len(dec_self) * T + np.arange(T)  # d_Ld: the predictions
    encoder_base = (2 * len(dec_self) + 1) * T
    found = np.zeros((T, S + T), dtype=np.int64)
    prefix = _csr(encoder_base, decoder)
    for t, start in enumerate(starts.tolist()):
        reached = breadth_first_order(prefix, start, return_predecessors=False)
        for k in reached[reached < T].tolist():
            found[t, S + k] = maximum_flow(prefix, start, k).flow_value
    bottom = mixing(enc_self[0]) if enc_self else None
    for s in range(S):
        into = [_block(bottom[:, [s]], encoder_base + S, encoder_base + s)] if enc_self else []
        graph = _csr(encoder_base + (len(enc_self) + 1) * S, [*decoder, *crossing, *encoder[1:], *into])
        for t, start in enumerate(starts.tolist()):
            found[t, s] = maximum_flow(graph, start, encoder_base + s).flow_value
    return found


def flow(enc_self: Sequence[np.ndarray], dec_self: Sequence[np.ndarray],
         cross: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(source (T, S), prefix (T, T)): each prediction's maximum flow to each source piece and each decoder
    input, each row normalised to sum to 1 over both."""
    T, S = np.asarray(cross[0]).shape[-2:]
    found = max_flows(enc_self, dec_self, cross) / SCALE
    total = found.sum(1, keepdims=True)
    found = np.divide(found, total, out=np.zeros_like(found), where=total > 0)
    return found[:, :S], found[:, S:]


# The cost of ``flow`` on one pair, measured on the toy Transformer's pairs of 26 to 151 source pieces (2 + 2
# layers; CPU seconds, Intel Xeon, 2026-12-06): a fixed part per max-flow problem (scipy's checks and copies
# around the solver) and a part per edge of each problem's network, rounded up from the least-squares fit:
# each run took 88% to 102% of the estimate (the largest pairs cost a little more per edge: their networks
# outgrow the caches); random attentions of 0 to 6 layers a side, 73% to 108% (diffuse attention costs
# more). docs/tutorials/looking-inside.md has the table.
SECONDS_PER_PROBLEM = 2.0e-4
SECONDS_PER_EDGE = 3.0e-8


def flow_seconds(S: int, T: int, enc_layers: int, dec_layers: int) -> float:
    """About how long ``flow`` takes on a pair of S source and T decoder positions (pieces, with EOS and
    BOS) through ``enc_layers`` + ``dec_layers`` layers, from its problems and their networks' edges
    (a causal decoder: each prediction reaches its prefix)."""
    Le, Ld, prefix = enc_layers, dec_layers, T * (T + 1) / 2
    to_source = max(Le - 1, 0) * S * S + (S if Le else 0) + Ld * (T * S + prefix + T)  # edges
    to_prefix = Ld * (prefix + T)
    problems, edges = T * S + prefix, T * S * to_source + prefix * to_prefix
    return SECONDS_PER_PROBLEM * problems + SECONDS_PER_EDGE * edges
