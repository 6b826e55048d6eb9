"""Attention modules: score functions for an RNN decoder, and multi-head attention over a kernel.

Letters: B batch, H heads, T query length, S key length, d head width, D model
width, A additive-attention width. Masks are bool, True = may attend (see `attnmt.models.masks`).

Two registries, both plain dicts:
  SCORES  name -> score module for single-query attention (`Attention`), here;
  KERNELS name -> kernel(q, k, v, mask, causal, need_weights, dropout_p), in `attnmt.models.kernels`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .kernels import KERNELS, Kernel, math_attention, sdpa_attention
from .masks import masked_softmax, normalise_mask

# --------------------------------------------------------------------------- scores


class AdditiveScore(nn.Module):
    """Bahdanau et al. 2015, App. A.1.2: score(q, k) = v^T tanh(W_q q + W_k k)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.query_proj = nn.Linear(query_dim, attn_dim, bias=False)
        self.key_proj = nn.Linear(key_dim, attn_dim)
        self.v = nn.Linear(attn_dim, 1, bias=False)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> W_k k (B, S, A)."""
        return self.key_proj(keys)

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, Dq), proj_keys (B, S, A) -> scores (B, T, S)."""
        q = self.query_proj(query)  # (B, T, A)
        hidden = torch.tanh(q[:, :, None, :] + proj_keys[:, None, :, :])  # (B, T, S, A)
        return self.v(hidden).squeeze(-1)  # (B, T, S)


class DotScore(nn.Module):
    """Luong et al. 2015, eq. (8) "dot": score(q, k) = q^T k. No parameters."""

    scaled = False

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        if query_dim != key_dim:
            name = "scaled_dot" if self.scaled else "dot"
            raise ValueError(
                f"attention score {name!r} needs query_dim == key_dim, got {query_dim} and {key_dim}; "
                "use 'general' or 'additive' for different sizes"
            )
        self.dim = key_dim

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Identity: keys (B, S, Dk)."""
        return keys

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, D), proj_keys (B, S, D) -> scores (B, T, S)."""
        scores = query @ proj_keys.transpose(1, 2)  # (B, T, S)
        return scores / math.sqrt(self.dim) if self.scaled else scores


class ScaledDotScore(DotScore):
    """Vaswani et al. 2017, eq. (1): score(q, k) = q^T k / sqrt(d)."""

    scaled = True


class GeneralScore(nn.Module):
    """Luong et al. 2015, eq. (8) "general": score(q, k) = q^T W k, W of shape (Dq, Dk)."""

    def __init__(self, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        self.key_proj = nn.Linear(key_dim, query_dim, bias=False)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> W k (B, S, Dq)."""
        return self.key_proj(keys)

    def forward(self, query: torch.Tensor, proj_keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, Dq), proj_keys (B, S, Dq) -> scores (B, T, S)."""
        return query @ proj_keys.transpose(1, 2)  # (B, T, S)


SCORES: dict[str, type[nn.Module]] = {
    "additive": AdditiveScore,
    "dot": DotScore,
    "general": GeneralScore,
    "scaled_dot": ScaledDotScore,
}


class Attention(nn.Module):
    """Single-head attention for an RNN decoder, with a score from `SCORES`.

    Keys are projected once per sentence (`project_keys`); each decoder step
    then calls `forward` with its query. `attn_dim` is used by `additive` only.
    """

    def __init__(self, score: str, query_dim: int, key_dim: int, attn_dim: int):
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"unknown attention score {score!r}; valid: {', '.join(SCORES)}")
        self.score = SCORES[score](query_dim, key_dim, attn_dim)

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (B, S, Dk) -> projected keys (B, S, *): W_k k, W k, or keys itself."""
        return self.score.project_keys(keys)

    def forward(
        self,
        query: torch.Tensor,
        proj_keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, Dq) or (B, T, Dq), proj_keys from `project_keys`, values (B, S, Dv),
        mask (B, S) bool or None -> (context (B, [T,] Dv), weights (B, [T,] S))."""
        single = query.dim() == 2
        if single:
            query = query[:, None, :]  # (B, 1, Dq)
        scores = self.score(query, proj_keys)  # (B, T, S)
        weights = masked_softmax(scores, None if mask is None else mask[:, None, :])  # (B, T, S)
        context = weights @ values  # (B, T, Dv)
        if single:
            return context.squeeze(1), weights.squeeze(1)
        return context, weights


# --------------------------------------------------------------------------- multi-head


class BlockDiagonalLinear(nn.Module):
    """`n_blocks` independent Linear(block_dim, block_dim) maps, one per slice of the features.

    Equal to a nn.Linear(D, D), D = n_blocks * block_dim, whose weight is
    `torch.block_diag(*weight)`: n_blocks * block_dim^2 weights instead of D^2.
    weight (n_blocks, out, in), bias (D,) or None.
    """

    def __init__(self, n_blocks: int, block_dim: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_blocks, block_dim, block_dim))
        self.bias = nn.Parameter(torch.empty(n_blocks * block_dim)) if bias else None
        # nn.Linear(block_dim, block_dim)'s initialisation, block by block.
        bound = 1 / math.sqrt(block_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., D) -> (..., D)."""
        blocks = x.unflatten(-1, (self.weight.shape[0], self.weight.shape[2]))  # (..., H, dh)
        out = torch.einsum("...hi,hoi->...ho", blocks, self.weight).flatten(-2)  # (..., D)
        return out if self.bias is None else out + self.bias


HEADS = ("full", "split")


class MultiHeadAttention(nn.Module):
    """Multi-head attention, Vaswani et al. 2017 sec. 3.2.2, over a kernel from `KERNELS`.

    heads="full": each head projects the whole input (one nn.Linear(D, D) per Q, K, V).
    heads="split": the input is cut into n_heads slices of D / n_heads features and
    each head projects only its own slice (`BlockDiagonalLinear`); out_proj stays full.
    kernel: a name in `KERNELS`, or a callable with the kernel signature (e.g.
    `functools.partial(sparse_attention, window=64, stride=64)`).
    dropout applies to the attention probabilities, in training only.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        kernel: str | Kernel = "sdpa",
        heads: str = "full",
        bias: bool = True,
    ):
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        if isinstance(kernel, str):
            if kernel not in KERNELS:
                raise ValueError(f"unknown attention kernel {kernel!r}; valid: {', '.join(KERNELS)}")
            kernel = KERNELS[kernel]
        if heads not in HEADS:
            raise ValueError(f"unknown heads {heads!r}; valid: {', '.join(HEADS)}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.kernel = kernel
        self.heads = heads
        for name in ("q_proj", "k_proj", "v_proj"):
            if heads == "full":
                setattr(self, name, nn.Linear(d_model, d_model, bias=bias))
            else:
                setattr(self, name, BlockDiagonalLinear(n_heads, self.d_head, bias=bias))
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, dh)."""
        return x.unflatten(-1, (self.n_heads, self.d_head)).transpose(1, 2)

    def project_q(self, x: torch.Tensor) -> torch.Tensor:
        """Queries x (B, T, D) -> (B, H, T, dh)."""
        return self._split_heads(self.q_proj(x))

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention: x (B, T, D) -> (q, k, v), each (B, H, T, dh)."""
        return (self._split_heads(self.q_proj(x)), self._split_heads(self.k_proj(x)),
                self._split_heads(self.v_proj(x)))

    def project_kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values x (B, S, D) -> (k, v), each (B, H, S, dh); cache these when decoding."""
        return self._split_heads(self.k_proj(x)), self._split_heads(self.v_proj(x))

    @property
    def step_kernel(self) -> Kernel:
        """The kernel for a few queries against cached keys (one decoding step).

        `sdpa` steps with `math`: the same product, but the fused CPU kernel's
        per-call setup costs more than the whole product at one query per row
        (`scripts/bench/bench_decode.py --parts` measures both). Any other kernel steps
        with itself.
        """
        return math_attention if self.kernel is sdpa_attention else self.kernel

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
        kernel: Kernel | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention over projected heads, merged and put through out_proj.

        q (B, H, T, dh), k and v (B, H, S, dh); mask (B, S) key padding, (T, S),
        (B, T, S) or (B, H, T, S), see `normalise_mask`; causal is end-aligned.
        Returns (out (B, T, D), weights (B, H, T, S) if need_weights else None).
        A kernel that returns no weights is replaced by `math_attention` for a
        call with need_weights (`sdpa` and `sparse` do that themselves; `linear`
        returns its own normalised phi(Q) phi(K)^T). ``kernel`` overrides the
        module's kernel for this call (decoding passes `step_kernel`).
        """
        B, _, T, _ = q.shape
        mask = normalise_mask(mask, B, T, k.shape[-2])  # (b, h, t, S)
        dropout_p = self.dropout if self.training else 0.0
        context, weights = (kernel or self.kernel)(
            q, k, v, mask, causal=causal, need_weights=need_weights, dropout_p=dropout_p
        )  # (B, H, T, dh)
        if need_weights and weights is None:
            context, weights = math_attention(q, k, v, mask, causal, True, dropout_p)
        out = self.out_proj(context.transpose(1, 2).flatten(-2))  # (B, T, D)
        return out, weights if need_weights else None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """query (B, T, D), key and value (B, S, D) -> (out (B, T, D), weights (B, H, T, S) or None)."""
        if query is key and key is value:
            q, k, v = self.project_qkv(query)  # each (B, H, T, dh)
        else:
            q = self.project_q(query)  # (B, H, T, dh)
            k = self._split_heads(self.k_proj(key))  # (B, H, S, dh)
            v = self._split_heads(self.v_proj(value))  # (B, H, S, dh)
        return self.attend(q, k, v, mask, causal, need_weights)


# --------------------------------------------------------------------------- the alignment layer


class AlignmentLayer(nn.Module):
    """A cross-attention of its own that learns word alignment and nothing else (Zenkel et al. 2019, 2020).

    Its queries are the decoder's states after one layer, its keys and values the encoder's output, both
    detached: no gradient of its loss reaches the translation, which is therefore the same, bit for bit, with
    or without it. One head; no dropout (it draws no random numbers either). ``forward`` gives its weights
    (B, 1, T, S) and, given the translation's output matrix, its prediction of each target piece from the
    source alone (Zenkel et al. 2019's unsupervised objective): the attended values, projected and normalised,
    times that matrix (detached), so the layer adds four d x d matrices and no vocabulary-sized one. With
    ``shift``, piece t's query is the state one position later, where piece t is the input (Shift-Att).
    With ``feed_forward``, the queries and keys each pass through a residual feed-forward block of their own
    before they meet, and a shifted query adds the state where its piece is predicted; ``dropout`` drops
    queries, keys and those blocks' hidden units. The layer runs after the translation's forward, so the
    random numbers it draws are none the translation would have drawn (each micro-batch seeds its own).
    """

    def __init__(self, d_model: int, layer: int, full_context: bool, predicts: bool, shift: bool = False,
                 feed_forward: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        self.layer, self.full_context = layer, full_context  # 0-based; which decoder pass feeds the queries
        self.predicts = predicts  # trained by its predictions (objective predict), not by given links
        self.shift = shift  # piece t's query: the state at t + 1, whose input piece t is (Shift-Att)
        self.query, self.key, self.value, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.feed_forward = feed_forward
        if feed_forward:
            if shift:  # the state where piece t is predicted, beside the one where it is the input
                self.query_here = nn.Linear(d_model, d_model)
            wide = 2 * d_model
            self.query_block, self.key_block = (nn.Sequential(
                nn.Linear(d_model, wide), nn.GELU(), self.dropout, nn.Linear(wide, d_model))
                for _ in range(2))

    def forward(self, states: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                output: nn.Linear | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """states (B, T, D), memory (B, S, D), src_mask (B, S) -> (weights (B, 1, T, S), logits (B, T, V)
        or None)."""
        states, memory = states.detach(), memory.detach()
        here = states
        if self.shift:  # an EOS row gets the next (padding) state or its own: it is not taught or read
            states = torch.cat([states[:, 1:], states[:, -1:]], dim=1)
        q, k = self.query(states), self.key(memory)  # (B, T, D), (B, S, D)
        if self.feed_forward and self.shift:
            q = q + self.query_here(here)
        q, k = self.dropout(q), self.dropout(k)
        if self.feed_forward:
            q, k = q + self.query_block(q), k + self.key_block(k)
        scores = q @ k.transpose(1, 2) / math.sqrt(q.size(-1))  # (B, T, S)
        weights = masked_softmax(scores.float(), src_mask[:, None, :])  # (B, T, S), float32
        logits = None
        if output is not None:
            context = self.norm(self.out(weights @ self.value(memory)))  # (B, T, D)
            bias = output.bias.detach() if output.bias is not None else None
            logits = nn.functional.linear(context, output.weight.detach(), bias)  # (B, T, V)
        return weights[:, None], logits


def attach_aligner(model: nn.Module, d_model: int, layer: int, full_context: bool, predicts: bool,
                   seed: int, **options) -> None:
    """Give ``model`` an alignment layer (``model.aligner``; ``options``: ``AlignmentLayer``'s ``shift``,
    ``feed_forward`` and ``dropout``), initialised from ``seed`` in a random state of its own: the
    translation's weights and dropout draw the same random numbers as without it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model.aligner = AlignmentLayer(d_model, layer, full_context, predicts, **options)
