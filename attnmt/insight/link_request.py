"""What ``align`` may be asked, and its defaults: the option rules the command line used to hold, owned by
the library so that every caller (the CLI, a script, a server) gets the same answers and the same errors.

- ``Layer`` and ``Heads``: which cross-attention is read (``--layer 2|last|avg``, ``--heads 1,3|all``),
  parsed from their text (ValueError) and checked against a model (ConfigError naming the option).
- ``check_request``: the options that do not go together (``--gold`` without ``--tgt``, ``--symmetrize``
  without ``--reverse``, ``--calibrate`` with a reading of its own, a gradient attribution with a layer),
  as one ConfigError line, before any model is loaded.
- ``reading``: one model's layer, heads and ``AlignOptions``: those given, else the model's own defaults
  (the reading ``align --calibrate`` stored for its run, else the layer and heads ``train.alignment``
  taught it, else every layer and head).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .links import AlignOptions

# The command line reads ``Layer`` and ``Heads`` as it starts, so the modules with torch behind them are
# imported where they are used.


@dataclass(frozen=True)
class Layer:
    """``align --layer``: a 1-based layer number, last, avg (every layer and head averaged), or aligner (the
    model's alignment layer, ``train.alignment.module: layer``)."""

    text: str
    index: int | None  # 0-based; -1 for the last; None for the average (or the alignment layer)
    kind: str = "cross"  # the attention read: ``cross``, or ``align`` (the alignment layer)

    @classmethod
    def parse(cls, value: str | Layer) -> Layer:
        if isinstance(value, Layer):
            return value
        choice = value.strip().lower()
        if choice in ("avg", "average", "mean"):
            return cls(value, None)
        if choice == "last":
            return cls(value, -1)
        if choice in ("aligner", "align", "alignment"):
            return cls(value, None, "align")
        try:
            number = int(choice)
        except ValueError:
            raise ValueError(f"{value!r}: expected a layer number (1, 2, ...), last, avg or "
                             "aligner") from None
        if number < 1:
            raise ValueError(f"{value}: layers count from 1")
        return cls(value, number - 1)

    def check(self, n_layers: int, which: str = "", aligner: bool = False) -> None:
        """A ConfigError unless the model (``n_layers`` cross-attention layers, an alignment layer or not) has
        this layer; ``which`` names the model in the message ("--reverse ")."""
        if self.kind == "align" and not aligner:
            raise ConfigError(f"--layer {self.text}: the {which}model has no alignment layer (it is trained "
                              "with train.alignment.module: layer)")
        if self.index is not None and self.index >= n_layers:
            raise ConfigError(f"--layer {self.text}: the {which}model has {n_layers} cross-attention "
                              f"layer(s) (1..{n_layers}, or avg)")


@dataclass(frozen=True)
class Heads:
    """``align --heads 1,3``: 1-based head numbers, or all."""

    text: str
    indices: tuple[int, ...] | None  # 0-based; None for every head

    @classmethod
    def parse(cls, value: str | Heads) -> Heads:
        if isinstance(value, Heads):
            return value
        if value.strip().lower() in ("all", "avg", "average"):
            return cls(value, None)
        try:
            numbers = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise ValueError(f"{value!r}: expected head numbers such as 1,3, or all") from None
        if not numbers or min(numbers) < 1:
            raise ValueError(f"{value!r}: heads count from 1")
        return cls(value, tuple(sorted({n - 1 for n in numbers})))

    def check(self, n_heads: int, which: str = "") -> None:
        if self.indices is not None and self.indices[-1] >= n_heads:
            raise ConfigError(f"--heads {self.text}: the {which}model has {n_heads} attention head(s) "
                              f"per layer (1..{n_heads}, or all)")


@dataclass(frozen=True)
class AlignRequest:
    """The options of one ``align`` run that constrain each other (None or False: not given)."""

    tgt: Path | None = None
    gold: Path | None = None
    hyp_out: Path | None = None
    output: Path | None = None
    layer: Layer | None = None
    heads: Heads | None = None
    shift: bool = False
    threshold: float = 0.3
    reverse: Path | None = None
    symmetrize: str | None = None
    source: str = "attention"  # or a gradient attribution's name (``--from``)
    calibrate: Path | None = None


def check_request(request: AlignRequest) -> None:
    """The first rule ``request`` breaks, as one ConfigError naming the options; nothing if none."""
    r = request
    if not 0 < r.threshold <= 1:
        raise ConfigError(f"--threshold {r.threshold}: expected a weight in (0, 1]")
    if r.gold is not None and r.tgt is None:
        raise ConfigError("--gold needs --tgt: gold links refer to the target sentences they were made for")
    if r.hyp_out is not None and r.tgt is not None:
        raise ConfigError("--hyp-out writes the model's own translations; it cannot be used with --tgt")
    if r.symmetrize is not None and r.reverse is None:
        raise ConfigError("--symmetrize combines two directions: it needs --reverse MODEL")
    check_source(r.source, r.layer, r.heads, r.shift)
    if r.calibrate is not None:
        given = {"--gold": r.gold, "--layer": r.layer, "--heads": r.heads, "--reverse": r.reverse,
                 "--from": r.source != "attention", "--output": r.output}
        check_calibrate(r.tgt, given)


def check_source(source: str, layer: Layer | None, heads: Heads | None, shift: bool) -> None:
    """``align --from``: a gradient attribution or ALTI+ has no layers, heads or shifted rows to choose; a
    gradient attribution needs captum (said before a model is loaded)."""
    if source != "attention":
        chosen = (("--layer", layer), ("--heads", heads), ("--shift", shift))
        given = [name for name, value in chosen if value]
        if given:
            what = "ALTI+'s contributions" if source == "alti" else "a gradient attribution"
            raise ConfigError(f"{given[0]} chooses what attention is read; --from {source} reads "
                              f"{what} instead")
        if source == "alti":
            return
        from .attribution import captum_attr

        captum_attr()


def check_calibrate(tgt: Path | None, given: dict) -> None:
    """``align --calibrate``: it needs the targets its gold links refer to, and chooses the reading
    itself."""
    if tgt is None:
        raise ConfigError("--calibrate needs --tgt: the gold links refer to the target sentences they were "
                          "made for")
    clash = [name for name, value in given.items() if value]
    if clash:
        raise ConfigError(f"--calibrate chooses the layer and heads itself and writes the run folder's "
                          f"reading; it cannot be used with {clash[0]}")


def layer_and_heads(cfg, layer: Layer | None = None, heads: Heads | None = None,
                    checkpoint: Path | None = None) -> tuple[Layer, Heads]:
    """The layer and heads given, else the model's defaults (``reading.default_align_options``)."""
    from .reading import default_align_options

    default = default_align_options(cfg, checkpoint)
    if layer is None and default.kind == "align":
        layer = Layer.parse("aligner")
    elif layer is None:
        layer = Layer.parse("avg" if default.layer is None else str(default.layer + 1))
    if heads is None:
        heads = Heads.parse("all" if default.heads is None else ",".join(str(h + 1) for h in default.heads))
    return layer, heads


def reading(cfg, layer: Layer | None, heads: Heads | None, which: str = "", checkpoint: Path | None = None,
            **options) -> tuple[Layer, Heads, AlignOptions]:
    """(layer, heads, ``AlignOptions``) of one model: the layer and heads given, else its defaults
    (``layer_and_heads``), checked against the model; the full-context pass or the causal one as given
    (``full_context`` in ``options``), else as the model was taught; ``which`` names it in messages
    ("--reverse ")."""
    from ..models import attention_layout
    from .links import AlignOptions
    from .reading import default_align_options

    layer, heads = layer_and_heads(cfg, layer, heads, checkpoint)
    n_layers, n_heads = attention_layout(cfg.model)
    layer.check(n_layers["cross"], which, has_aligner(cfg))
    heads.check(1 if layer.kind == "align" else n_heads, which)
    if layer.kind == "align":  # the layer reads the pass it was trained on, with a null word if taught one
        options["full_context"] = False
        options["null"] = cfg.train.alignment.objective == "links"
    elif options.get("full_context") is None:
        options["full_context"] = default_align_options(cfg).full_context
    elif options["full_context"] and cfg.model.arch != "transformer":
        raise ConfigError(f"--full-context: the {which}model is an {cfg.model.arch}, whose decoder reads its "
                          "target left to right only")
    return layer, heads, AlignOptions(layer.index, heads.indices, kind=layer.kind, **options)


def has_aligner(cfg) -> bool:
    """Whether the model of ``cfg`` carries an alignment layer (``train.alignment.module: layer``)."""
    guided = cfg.train.alignment
    return guided is not None and guided.module == "layer"
