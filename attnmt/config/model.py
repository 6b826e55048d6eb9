"""The ``model`` section of the config schema: ``LSTMConfig``, ``TransformerConfig`` and their union
``ModelConfig``, with the strict types and the ``Section`` base every section of ``schema.py`` shares.

``schema.py`` imports and re-exports all of them (``from attnmt.config.schema import TransformerConfig`` keeps
working); load_config, the other sections and the error messages live there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import StrictBool as Bool

# Strict float: accepts 3 or 3.0 but not "3" or true; finite only (.nan and .inf are mistakes here).
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(strict=True, gt=0)]
Probability = Annotated[float, Field(strict=True, ge=0.0, lt=1.0, allow_inf_nan=False)]
Probability1 = Annotated[float, Field(strict=True, gt=0.0, le=1.0, allow_inf_nan=False)]  # in (0, 1]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class LSTMConfig(Section):
    arch: Literal["lstm"]
    """``lstm``: Bahdanau et al. 2015's attention encoder-decoder, with Luong et al. 2015's input feeding."""
    emb_dim: PositiveInt = 256
    """The width of the source and target embeddings."""
    hidden_size: PositiveInt = 256
    """Per direction in the encoder."""
    dec_hidden_size: PositiveInt | None = None
    """The decoder's hidden size; default 2 * hidden_size (the width of the encoder's output)."""
    enc_layers: PositiveInt = 2
    """Layers of the bidirectional encoder LSTM."""
    dec_layers: PositiveInt = 1
    """Layers of the decoder LSTM."""
    dropout: Probability = 0.3
    """Dropout on the embeddings, the encoder's output, the attentional vector before the output layer
    and between stacked LSTM layers (training only)."""
    attention: Literal["additive", "dot", "general"] = "additive"
    """The decoder's attention score: additive (Bahdanau et al. 2015), dot or general (Luong et al. 2015);
    dot needs the decoder's hidden size to equal the encoder's output, 2 * hidden_size (the default)."""
    attn_dim: PositiveInt = 256
    """The width of the additive score's hidden layer; dot and general do not use it."""
    input_feeding: Bool = True
    """Feed each step's attentional vector into the next step's input (Luong et al. 2015)."""
    share_embeddings: Bool = False
    """Share source and target embeddings (needs a joint vocabulary)."""
    tie_embeddings: Bool = False
    """Tie the decoder's input embedding and the output projection."""


class TransformerConfig(Section):
    arch: Literal["transformer"]
    """``transformer``: the encoder-decoder of Vaswani et al. 2017."""
    d_model: PositiveInt = 256
    """The width of the embeddings and of every layer's input and output; divisible by n_heads."""
    n_heads: PositiveInt = 4
    """Heads of every attention (self and cross), each d_model / n_heads wide."""
    enc_layers: PositiveInt = 3
    """Encoder layers."""
    dec_layers: PositiveInt = 3
    """Decoder layers."""
    d_ff: PositiveInt = 1024
    """The inner width of each layer's feed-forward sublayer."""
    dropout: Probability = 0.1
    """Dropout on the embeddings (positions added), on each sublayer's output before the residual sum and
    inside the feed-forward sublayer (training only)."""
    attn_dropout: Probability = 0.0
    """Dropout on the attention probabilities (training only)."""
    activation: Literal["relu", "gelu", "silu"] = "relu"
    """The feed-forward sublayer's nonlinearity: silu is x * sigmoid(x), Marian's (OPUS-MT's) swish."""
    norm: Literal["pre", "post"] = "pre"
    """pre: x + f(LayerNorm(x)), with a final LayerNorm after the encoder and the decoder; post:
    LayerNorm(x + f(x)), as Vaswani et al. 2017."""
    positions: Literal["sinusoidal", "sinusoidal_concat", "learned"] = "sinusoidal"
    """Position encodings added to the embeddings: sinusoidal (fixed, any length; Vaswani et al. 2017, sec.
    3.5, sines and cosines interleaved), sinusoidal_concat (the same waves, all sines first and then all
    cosines: Marian's and OPUS-MT's layout) or learned (a table of max_positions rows)."""
    scale_embeddings: Bool = True
    """Multiply the embeddings by sqrt(d_model) before the positions are added (Vaswani et al. 2017, sec.
    3.4; OPUS-MT's scale_embedding)."""
    max_positions: PositiveInt = 1024
    """learned positions: the longest sequence in pieces, BOS or EOS included (a longer one is an error);
    also linformer's longest source. Sinusoidal encodings are computed past it."""
    enc_kernel: Literal["sdpa", "math", "linear", "sparse", "linformer", "performer"] = "sdpa"
    """The encoder's self-attention: sdpa (PyTorch's fused ``scaled_dot_product_attention``), math (the
    same softmax written out), or linear (Katharopoulos et al. 2020), sparse, linformer, performer; only
    sdpa and math export to CTranslate2."""
    sparse_window: PositiveInt = 32
    """enc_kernel sparse: each position sees the keys within this distance (Child et al. 2019)."""
    sparse_stride: PositiveInt = 32
    """enc_kernel sparse: and every key at a multiple of this distance (about sqrt(longest length))."""
    linformer_k: PositiveInt = 64
    """enc_kernel linformer: keys and values are projected to this many rows (Wang et al. 2020); the longest
    source is model.max_positions."""
    performer_features: PositiveInt = 128
    """enc_kernel or dec_kernel performer: positive orthogonal random features per head (FAVOR+,
    Choromanski et al. 2021), drawn once at initialisation and saved with the weights."""
    dec_kernel: Literal["sdpa", "math", "linear", "performer"] = "sdpa"
    """The decoder's self-attention, which runs causally (linformer cannot); cross-attention is always
    sdpa."""
    heads: Literal["full", "split"] = "full"
    """full: each head projects the whole input; split: each projects only its own d_model / n_heads
    features (fewer weights; does not export to CTranslate2)."""
    share_embeddings: Bool = True
    """Share source and target embeddings (needs a joint vocabulary: when the key is not given, it follows
    tokenizer.joint)."""
    tie_output: Bool = True
    """The output projection shares the target embedding's weights."""
    output_bias: Bool = False
    """A bias on the output projection's logits (Marian's final_logits_bias; an imported OPUS-MT model has
    one)."""

    @field_validator("dec_kernel", mode="before")
    @classmethod
    def _decoder_is_causal(cls, value: object) -> object:
        if value == "linformer":
            raise ValueError("linformer cannot apply to causal decoding (it projects the whole sequence, "
                             "future included); use it as enc_kernel")
        return value

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        return self


ModelConfig = Annotated[LSTMConfig | TransformerConfig, Field(discriminator="arch")]
