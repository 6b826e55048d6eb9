"""The configuration schema: pydantic models for every section, ``load_config`` and its error messages.

A config has five sections: ``data``, ``tokenizer``, ``model`` (``arch: lstm | transformer``), ``train`` and
``decode``. Every mistake is caught at load time and reported as one line that names the file, the line and
the dotted key, e.g. ``configs/toy_transformer.yaml:12: model.n_head: unknown key (did you mean n_heads?)``.

Files are read by ``yaml12.py`` (YAML 1.2 scalars, no duplicate keys, no aliases), which also keeps the
line of every key for these messages. The ``data`` and ``tokenizer`` sections' classes live in ``data.py``,
the ``model`` section's in ``model.py``; both are re-exported here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic import StrictBool as Bool
from pydantic import StrictInt as Int

from ..errors import ConfigError
from .choices import Device
from .data import DataConfig as DataConfig  # re-exported: the data section lives in config/data.py
from .data import HfSource as HfSource
from .data import JsonlSource as JsonlSource
from .data import SamplingConfig as SamplingConfig  # re-exported: the tokenizer section lives there too
from .data import Source as Source
from .data import TextSource as TextSource
from .data import TokenizerConfig as TokenizerConfig
from .data import ToySource as ToySource
from .data import TsvSource as TsvSource
from .data import check_corpora
from .describe import describe
from .languages import tokenizer_defaults
from .model import Float as Float  # re-exported: the model section and the shared types live there
from .model import LSTMConfig as LSTMConfig
from .model import ModelConfig, PositiveInt, Probability, Section
from .model import TransformerConfig as TransformerConfig
from .yaml12 import parse_yaml, read_yaml_file

# ------------------------------------------------------------------------------------ the sections


class GuidedAlignmentConfig(Section):
    """Guided alignment (Garg et al. 2019): a loss teaches heads or a layer the training corpus's links."""

    path: Path | None = None
    """A Pharaoh file (``i-j``: source word i, target word j; possible links ``i?j`` are not taught), one line
    per line of the training corpus as read (before cleaning); words are the space-separated tokens (CJK
    text without spaces: characters).
    Default: the toy task's own alignments (``data.train`` of format toy)."""
    one_based: Bool = False
    """The file counts words from 1 instead of 0 (Pharaoh's usual count)."""
    layer: PositiveInt | None = None
    """The decoder layer (1-based) whose cross-attention is taught; default: the penultimate one (the only
    one of a one-layer decoder), as Garg et al. chose."""
    heads: Annotated[list[PositiveInt], Field(min_length=1)] = [1]
    """The heads (1-based) of that layer that learn the alignment; the others stay free."""
    weight: Annotated[float, Field(strict=True, gt=0.0, allow_inf_nan=False)] = 0.05
    """lambda: the loss is cross-entropy + weight * alignment loss (Garg et al.: 0.05)."""
    full_context: Bool = False
    """Teach the heads in a second pass of the decoder, up to the taught layer, in which every target
    position sees the whole target (no causal mask: Garg et al.'s full-context alignment), and read them
    the same way in ``align``; Transformer only. The translation loss still comes from the causal pass."""
    module: Literal["head", "layer"] = "head"
    """Who learns the links: ``head``, the heads above, which also translate (Garg et al. 2019); ``layer``,
    an alignment layer of its own (Zenkel et al. 2019, 2020) whose queries are the decoder's states after
    ``layer`` and whose keys the encoder's output, both detached: only its loss trains it, and translation
    is bit for bit that of the same run without it. Transformer only; ``align``, ``plot`` and the explorer
    read it."""
    objective: Literal["links", "predict"] = "links"
    """What the alignment layer learns from: ``links``, those of ``path`` (or the toy task's); ``predict``,
    none: it predicts each target piece from the source alone, through its own attention (Zenkel et al.
    2019's unsupervised objective; the start of ``scripts/bootstrap_guided.py --teacher self``)."""
    shift: Bool = False
    """The alignment layer's query for target piece t is the decoder's state one position later, where
    piece t is the decoder's input (Shift-Att, Chen et al. 2020): the layer sees the word it aligns. Not with
    ``objective: predict`` (it would be shown the piece it predicts) or ``full_context``."""
    feed_forward: Bool = False
    """The alignment layer's queries and keys each pass a residual feed-forward block (2 x d_model, GELU) of
    their own, and a ``shift``-ed query adds the state where its piece is predicted: room for more links."""
    dropout: Annotated[float, Field(strict=True, ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.0
    """Dropout in the alignment layer (queries, keys, its blocks), drawn after all of the translation's."""
    translation: Literal["train", "frozen"] = "train"
    """``frozen``: only the alignment layer learns, on top of ``train.init_from``'s model (a trained run, or
    an imported OPUS-MT model), which goes on translating bit for bit as before."""


class TrainConfig(Section):
    """How ``attnmt train`` trains: the optimizer and its schedule, the budgets, validation and checkpoints.
    Steps are optimizer steps. A resume refuses a changed key that changes what the steps compute."""

    run_dir: Path | None = None
    """Where the run lives; default ``runs/<config name>`` in the working folder."""
    device: Device = Device.auto
    """Where to train: ``auto`` takes CUDA when the machine has it, else the CPU; ``cuda`` without CUDA is
    refused before the run starts."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """Autocast dtype of training and validation, fp32 master weights: ``bf16`` (CUDA, or a CPU with native
    bf16: AVX-512 BF16, AMX), ``fp16`` (CUDA only; a gradient scaler); ``auto``: bf16 there, else fp32."""
    compile: Bool = False
    """Run the training forward pass through ``torch.compile``: minutes of compiling first (117 s for the
    Multi30k Transformer in bf16 on a CPU, then a gain within the noise); off in the recipes."""
    gradient_checkpointing: Bool = False
    """Transformer only: keep each layer's input alone and compute its inside again in the backward pass
    (``torch.utils.checkpoint``), for less memory with deep models and long sentences; the same gradients."""
    seed: Int = 1
    """Seeds the initial weights, each epoch's batches, each step's dropout masks (reseeded per step, so a
    resumed run repeats them) and subword sampling's draws."""
    deterministic: Bool = False
    """``torch.use_deterministic_algorithms(True)`` (and cuBLAS's workspace setting for CUDA): PyTorch's
    deterministic kernels only, slower; an operation that has none then fails."""
    lr: Annotated[float, Field(strict=True, gt=0.0, allow_inf_nan=False)] = 5e-4
    """AdamW's peak learning rate, reached at the end of warmup (the rate itself after warmup with
    ``constant``, and with ``plateau`` until lowered)."""
    betas: tuple[Probability, Probability] = (0.9, 0.98)
    """AdamW's decay rates of the running means of the gradient and of its square."""
    weight_decay: Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)] = 0.0
    """AdamW's decoupled weight decay, on matrices only (biases and LayerNorm gains are not decayed)."""
    schedule: Literal["inverse_sqrt", "cosine", "plateau", "constant"] = "inverse_sqrt"
    """The rate after warmup: inverse_sqrt, lr * sqrt(warmup_steps / step) (Vaswani et al. 2017, eq. 3);
    cosine, down to min_lr at the last step; constant; plateau, lowered when validation stops improving."""
    plateau_patience: PositiveInt = 2
    """schedule plateau: validations without improvement (of ``metric``) before the rate is multiplied by
    ``plateau_factor``."""
    plateau_factor: Annotated[float, Field(strict=True, gt=0.0, lt=1.0, allow_inf_nan=False)] = 0.5
    """schedule plateau: what the rate is multiplied by each time ``plateau_patience`` runs out."""
    warmup_steps: Annotated[int, Field(strict=True, ge=0)] = 4000
    """Steps of linear warmup, from 0 to ``lr``; 0 = none."""
    min_lr: Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)] = 0.0
    """A floor under the rate after warmup, in every schedule; cosine decays to it."""
    max_steps: Annotated[int, Field(strict=True, ge=0)] = 0
    """0 = no limit (then max_epochs decides)."""
    max_epochs: PositiveInt = 100
    """Stop after this many epochs; with ``max_steps`` 0 it also sets the length cosine decays over."""
    max_minutes: Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)] = 0.0
    """Stop (validate, save) after this much training wall time, summed over resumes; 0 = no limit."""
    max_tokens: PositiveInt = 4096
    """Token budget of one batch: (padded) source or target tokens, whichever side is longer."""
    accum_steps: PositiveInt = 1
    """Batches whose gradients add up into one step: a step holds ``max_tokens`` x accum_steps x processes
    tokens, and N processes compute what one process with accum_steps N does."""
    clip_norm: Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)] = 1.0
    """Scale the gradients down to this global L2 norm when it is larger, before each step; 0 = never."""
    label_smoothing: Probability = 0.1
    """This share of each target token's probability mass goes to the whole vocabulary, evenly (in the
    training and the dev loss); 0 = plain cross-entropy."""
    log_every: PositiveInt = 50
    """Steps between training records (loss, rate, tokens per second, gradient norm) in metrics.jsonl."""
    eval_every: PositiveInt = 1000
    """Steps between validations on ``data.dev`` (loss, BLEU, chrF); a run also validates when it stops."""
    valid_beam_size: PositiveInt = 1
    """Beam size of the validation translations; 1 = greedy."""
    save_every: PositiveInt = 1000
    """Steps between checkpoints; a run also saves when it stops, and when a validation ranks among the
    ``keep_best``."""
    keep_last: Annotated[int, Field(strict=True, ge=2)] = 2
    """The newest checkpoints kept; an older one is deleted unless ``best.json`` or ``latest.json`` names
    it."""
    keep_best: PositiveInt = 1
    """The best checkpoints by ``metric`` kept besides the newest, ranked in ``checkpoints/best.json``."""
    metric: Literal["bleu", "chrf", "loss"] = "bleu"
    """What "best" means (checkpoints, ``patience``, the plateau schedule, an average): dev BLEU or chrF
    of the validation translations, higher is better, or the dev loss, lower is better."""
    patience: Annotated[int, Field(strict=True, ge=0)] = 0
    """Stop after this many validations without improvement; 0 = never."""
    max_nonfinite: PositiveInt = 10
    """Steps in a row with a non-finite loss or gradient (each skipped and logged) that stop the run as
    diverged, exit 6."""
    plot_every: Annotated[int, Field(strict=True, ge=0)] = 0
    """Every N-th validation, draw the attention on the first dev sentences into RUN/plots/step_XXXXXXXX/;
    0 = never."""
    tensorboard: Bool = False
    """Also write the training and validation records as TensorBoard events into ``RUN/tensorboard``
    (needs the tensorboard package)."""
    alignment: GuidedAlignmentConfig | None = None
    """Guided alignment training; off unless given."""
    average_last: Annotated[int, Field(strict=True, ge=0)] = 0
    """At the end of a run, average the weights of the newest ``average_last`` checkpoints (at most
    ``keep_last``) into ``RUN/checkpoints/average.pt`` and validate it; the run folder's best is the average
    when it scores better. 0 = off."""
    init_from: Path | None = None
    """Fine-tuning: start a new run from this checkpoint's (or run folder's) weights, with its tokenizer;
    the model config must be the same; optimizer and schedule start fresh. Ignored once the run has a
    checkpoint of its own (a resume continues from that)."""
    freeze_embeddings: Bool = False
    """Train everything but the source and target embeddings (and the output layer when it shares their
    weights): fine-tuning a pretrained model on a few thousand pairs, whose embeddings would otherwise move
    only for the pieces those pairs hold."""


    @model_validator(mode="after")
    def _average_fits(self) -> TrainConfig:
        if self.average_last == 1:
            raise ValueError("average_last: 1 is no average; give 0 (off) or at least 2")
        if self.average_last > self.keep_last:
            raise ValueError(f"average_last ({self.average_last}) must not exceed keep_last "
                             f"({self.keep_last}): "
                             "the checkpoints averaged are the newest ones kept")
        return self


class DecodeConfig(Section):
    """How a model translates by default (``translate``, ``eval``, ``serve``, validation); options of the
    commands (``--beam-size``, ``--length-penalty``, ``--max-tokens``, ``--int8``) override it."""

    beam_size: PositiveInt = 5
    """Beam search's width; 1 = greedy. Validation uses ``train.valid_beam_size`` instead."""
    nbest: PositiveInt = 1
    """At most beam_size; outputs per sentence come from ``translate --nbest`` or a request's ``nbest``."""
    length_penalty: Annotated[float, Field(strict=True, ge=0.0, le=10.0, allow_inf_nan=False)] = 0.6
    """GNMT alpha (Wu et al. 2016, eq. 14; tuned there in [0.2, 1]); 0 = plain log-probability."""
    min_len: Annotated[int, Field(strict=True, ge=0)] = 0
    """EOS is banned before the output has this many pieces (the length limit below wins)."""
    max_len_a: Annotated[float, Field(strict=True, ge=0.0, allow_inf_nan=False)] = 1.5
    """a of the length limit, pieces of output per source piece (see max_len_b)."""
    max_len_b: Annotated[int, Field(strict=True, ge=1)] = 10
    """The output has at most a * source length + b pieces; EOS is forced at that point."""
    max_src_len: PositiveInt = 256
    """A longer source is cut to this many pieces (``translate`` reports how many were)."""
    max_tokens: PositiveInt = 8000
    """Batch budget of translation and validation: padded source pieces x beam rows (or samples)."""
    quantize: Literal["none", "int8"] = "none"
    """``int8``: int8 linear layers in the decoding commands (``--int8``; CPU); validation stays float."""

    @model_validator(mode="after")
    def _nbest_fits(self) -> DecodeConfig:
        if self.nbest > self.beam_size:
            raise ValueError(f"nbest ({self.nbest}) must not exceed beam_size ({self.beam_size})")
        return self


class Config(Section):
    data: DataConfig
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (paths as strings), as written into the run folder."""
        return self.model_dump(mode="json")


# The tags of the config's unions (data sources, model architectures), which pydantic puts in error locations.
UNION_TAGS = frozenset({"text", "tsv", "jsonl", "hf", "toy", "lstm", "transformer", "one", "many"})


# -------------------------------------------------------------------------------------- load_config


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read, check and resolve a config file; ``overrides`` are ``dotted.key=yaml-value`` strings."""
    path = Path(path)
    data, lines = read_yaml_file(path)
    return config_from_dict(data, source=str(path), base_dir=path.parent, overrides=overrides, lines=lines)


def config_from_dict(data: Any, source: str = "<config>", base_dir: Path | None = None,
                     overrides: list[str] | tuple[str, ...] = (),
                     lines: dict[tuple[str, ...], int] | None = None) -> Config:
    """Validate an already-parsed config; relative paths resolve against ``base_dir``."""
    if data is None:
        raise ConfigError(f"{source}: config is empty; it must be a mapping with sections data, model, ...")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: config must be a mapping, not a {type(data).__name__}")
    lines = dict(lines or {})
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(data, key, value, f"--set {key}")
        lines.pop(tuple(key.split(".")), None)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(e, source, lines, overrides, Config, UNION_TAGS)) from None
    if base_dir is not None:
        # Paths in the file are relative to the file; paths typed on the command line, to the shell.
        _resolve_paths(cfg, base_dir.resolve(), "", {o.partition("=")[0].strip() for o in overrides},
                       lambda key: _where(key, source, lines, overrides))
    if cfg.train.run_dir is None:
        stem = Path(source).stem if source != "<config>" else "run"
        cfg.train.run_dir = Path.cwd() / "runs" / stem
    _resolve_defaults(cfg, source, lines, overrides)
    return cfg


def _resolve_defaults(cfg: Config, source: str, lines: dict[tuple[str, ...], int], overrides) -> None:
    """Defaults that follow other keys: sentencepiece's by the languages, shared embeddings by the tokenizer;
    a shared embedding over separate vocabularies is refused (it would tie unrelated pieces)."""
    _resolve_alignment(cfg, source, lines, overrides)
    _check_sampling(cfg, source, lines, overrides)
    check_corpora(cfg.data, lambda key: _where(key, source, lines, overrides))
    tok, langs = cfg.tokenizer, cfg.data.languages()
    for key, value in tokenizer_defaults(langs).items():
        if getattr(tok, key) is None:
            setattr(tok, key, value)
    if tok.joint or not cfg.model.share_embeddings:
        return
    if "share_embeddings" not in cfg.model.model_fields_set:
        cfg.model.share_embeddings = False  # the default follows the tokenizer
        return
    key = "model.share_embeddings"
    line = lines.get(("model", "share_embeddings"))
    if any(o.partition("=")[0].strip() == key for o in overrides):
        where = f"--set {key}"
    else:
        where = f"{source}:{line}: {key}" if line else f"{source}: {key}"
    raise ConfigError(f"{where}: true needs tokenizer.joint: true (with separate vocabularies, source piece "
                      "k would be tied to the unrelated target piece k)")


def _where(key: str, source: str, lines: dict[tuple[str, ...], int], overrides) -> str:
    """Where a key was set, for a message: ``--set KEY``, ``FILE:LINE: KEY`` or ``FILE: KEY``."""
    if any(o.partition("=")[0].strip() == key for o in overrides):
        return f"--set {key}"
    line = lines.get(tuple(key.split(".")))
    return f"{source}:{line}: {key}" if line else f"{source}: {key}"


def _resolve_alignment(cfg: Config, source: str, lines: dict[tuple[str, ...], int], overrides) -> None:
    """``train.alignment``: its layer defaults to the penultimate decoder layer; layer and heads must exist
    in the model, and without ``path`` the training data must be the toy task (which has alignments)."""
    guided = cfg.train.alignment
    if guided is None:
        return
    transformer = cfg.model.arch == "transformer"
    n_layers, n_heads = (cfg.model.dec_layers, cfg.model.n_heads) if transformer else (1, 1)
    if guided.layer is None:
        guided.layer = max(n_layers - 1, 1)
    elif guided.layer > n_layers:
        raise ConfigError(f"{_where('train.alignment.layer', source, lines, overrides)}: {guided.layer}, but "
                          f"the model has {n_layers} cross-attention layer(s) (1..{n_layers})")
    if guided.full_context and not transformer:
        raise ConfigError(f"{_where('train.alignment.full_context', source, lines, overrides)}: full-context "
                          "alignment needs model.arch transformer (the LSTM decoder reads left to right)")
    _check_module(guided, transformer, cfg.train.init_from is not None,
                  lambda key: _where(f"train.alignment.{key}", source, lines, overrides))
    if max(guided.heads) > n_heads:
        raise ConfigError(f"{_where('train.alignment.heads', source, lines, overrides)}: {guided.heads}, but "
                          f"the model has {n_heads} head(s) per layer (1..{n_heads})")
    guided.heads = sorted(set(guided.heads))
    if guided.objective == "predict":
        return  # no links to read
    corpora = cfg.data.corpora()
    if len(corpora) > 1:
        raise ConfigError(f"{_where('train.alignment', source, lines, overrides)}: guided alignment reads "
                          f"one training corpus's alignments, and data.train lists {len(corpora)}")
    train = corpora[0]
    if guided.path is None and train.format == "toy" and train.lang == "zh":
        raise ConfigError(f"{_where('train.alignment', source, lines, overrides)}: the Chinese toy task's "
                          "alignments count segmented words, but its training text is unsegmented "
                          "(characters); give a path")
    if guided.path is None and train.format != "toy":
        raise ConfigError(f"{_where('train.alignment', source, lines, overrides)}: path is required "
                          "(the alignments of data.train, one Pharaoh line per line); only the toy task "
                          "brings its own")


def _check_module(guided: GuidedAlignmentConfig, transformer: bool, init_from: bool, where) -> None:
    """The keys of the alignment layer (``module: layer``) and what they need."""
    if guided.module == "layer" and not transformer:
        raise ConfigError(f"{where('module')}: layer needs model.arch transformer (the LSTM's one attention "
                          "is its alignment)")
    if guided.module == "head":
        for key, default in (("objective", "links"), ("translation", "train"), ("shift", False),
                             ("feed_forward", False), ("dropout", 0.0)):
            if getattr(guided, key) != default:
                raise ConfigError(f"{where(key)}: {getattr(guided, key)} is the alignment layer's "
                                  "(train.alignment.module: layer)")
        return
    if guided.heads != [1]:
        raise ConfigError(f"{where('heads')}: {guided.heads}, but the alignment layer has one head of its "
                          "own (train.alignment.module: layer); leave heads out")
    if guided.shift and (guided.objective == "predict" or guided.full_context):
        clash = ("objective predict: it would be shown the piece it predicts" if guided.objective == "predict"
                 else "full_context: that pass sees the whole target already")
        raise ConfigError(f"{where('shift')}: true does not go with {clash}")
    if guided.translation == "frozen" and not init_from:
        raise ConfigError(f"{where('translation')}: frozen needs train.init_from (the trained model the "
                          "alignment layer learns on top of)")
    if guided.objective == "predict" and guided.path is not None:
        raise ConfigError(f"{where('path')}: objective predict learns from no links; leave path out, or "
                          "use objective links")


def _check_sampling(cfg: Config, source: str, lines: dict[tuple[str, ...], int], overrides) -> None:
    """``tokenizer.sampling``: ``nbest`` is a unigram model's (BPE-dropout has no n-best list); guided
    alignment's links count the pieces of the deterministic segmentation."""
    sampling = cfg.tokenizer.sampling
    # A saved config holds the default nbest: only another value is refused (checkpoints must load again).
    if sampling is not None and cfg.tokenizer.model_type == "bpe" and (
            sampling.nbest != SamplingConfig.model_fields["nbest"].default):
        raise ConfigError(f"{_where('tokenizer.sampling.nbest', source, lines, overrides)}: a unigram "
                          "model's option; with tokenizer.model_type bpe, sampling is BPE-dropout, each "
                          "merge dropped with probability tokenizer.sampling.alpha")
    if sampling is not None and cfg.train.alignment is not None:
        raise ConfigError(f"{_where('tokenizer.sampling', source, lines, overrides)}: cannot go with "
                          "train.alignment, whose links count the pieces of the deterministic segmentation")


def parse_override(item: str) -> tuple[str, Any]:
    """``"train.lr=3e-4"`` -> ``("train.lr", 0.0003)``; the value is read as a YAML scalar."""
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_0-9][\w]*)*", key):
        raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. train.lr=3e-4")
    parsed, _ = parse_yaml(value, f"--set {key}") if value.strip() else ("", {})
    return key, parsed


def set_dotted(data: dict, key: str, value: Any, where: str) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where}: {part} is not a section")
        node = nxt
    node[parts[-1]] = value


def _resolve_paths(model: BaseModel, base: Path, prefix: str = "",
                   from_shell: set[str] = frozenset(), where=lambda key: key) -> None:
    """Make every relative Path field absolute, in place: against the config's folder, or against the
    working folder for keys given with ``--set`` (``from_shell``); ``where(key)`` names a key in errors."""
    for name in type(model).model_fields:
        value, key = getattr(model, name), prefix + name
        root = Path.cwd() if key in from_shell else base
        if isinstance(value, BaseModel):
            _resolve_paths(value, base, key + ".", from_shell, where)
        elif isinstance(value, Path):
            object.__setattr__(model, name, _absolute(value, root, where(key)))
        elif isinstance(value, list) and value and all(isinstance(v, Path) for v in value):
            object.__setattr__(model, name, [_absolute(v, root, where(key)) for v in value])
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    _resolve_paths(item, base, f"{key}.{i}.", from_shell, where)


def _absolute(path: Path, base: Path, where: str = "path") -> Path:
    try:
        path = path.expanduser()
    except RuntimeError:  # pathlib's answer to ~user of an unknown user, or to no home folder at all
        raise ConfigError(f"{where}: cannot expand ~ in {str(path)!r} (no such user or home folder)"
                          ) from None
    return path if path.is_absolute() else base / path
