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
    emb_dim: PositiveInt = 256
    hidden_size: PositiveInt = 256
    """Per direction in the encoder."""
    dec_hidden_size: PositiveInt | None = None
    """The decoder's hidden size; default 2 * hidden_size (the width of the encoder's output)."""
    enc_layers: PositiveInt = 2
    dec_layers: PositiveInt = 1
    dropout: Probability = 0.3
    attention: Literal["additive", "dot", "general"] = "additive"
    attn_dim: PositiveInt = 256
    input_feeding: Bool = True
    share_embeddings: Bool = False
    """Share source and target embeddings (needs a joint vocabulary)."""
    tie_embeddings: Bool = False
    """Tie the decoder's input embedding and the output projection."""


class TransformerConfig(Section):
    arch: Literal["transformer"]
    d_model: PositiveInt = 256
    n_heads: PositiveInt = 4
    enc_layers: PositiveInt = 3
    dec_layers: PositiveInt = 3
    d_ff: PositiveInt = 1024
    dropout: Probability = 0.1
    attn_dropout: Probability = 0.0
    activation: Literal["relu", "gelu"] = "relu"
    norm: Literal["pre", "post"] = "pre"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: PositiveInt = 1024
    enc_kernel: Literal["sdpa", "math", "linear", "sparse", "linformer", "performer"] = "sdpa"
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
    heads: Literal["full", "split"] = "full"
    share_embeddings: Bool = True
    """Share source and target embeddings (needs a joint vocabulary: when the key is not given, it follows
    tokenizer.joint)."""
    tie_output: Bool = True

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
