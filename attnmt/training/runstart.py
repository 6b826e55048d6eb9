"""What a training run settles before its loop: settings refused before the run folder is touched
(``preflight``), the autocast dtype, the weights a fine-tuning run starts from, whether the data must be
prepared, the run folder's tokenizer held to its checkpoint (``run_tokenizer``), the guided-alignment links
of the training pairs, and the subword sampler of the training pairs. ``train.Trainer`` calls these once."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config.choices import cpu_flags
from ..config.jsonfile import read_json
from ..config.languages import bleu_tokenizer, missing_extra
from ..config.schema import Config, load_config
from ..data.batching import EncodedSplit, TokenBatchSampler
from ..data.prepare import write_tokenizer
from ..data.readers import describe_source
from ..data.subword_sampling import SubwordSampler, longest_sampled
from ..data.tokenizer import Tokenizer, folder_sha256, load_tokenizer, recorded_sha256
from ..errors import CheckpointError, ConfigError, DataError
from ..models.checkpoint import diff_dicts, load_model, recorded_tokenizer
from ..runfiles import RunDir
from .distributed import choose_device
from .guided import piece_alignments


def preflight(cfg: Config) -> None:
    """What would fail only later, refused now, before the run folder is touched: fp16 on the CPU or a
    missing CUDA, gradient checkpointing of an LSTM, and a validation that scores the dev set with BLEU's
    tokenizer for the target language, which for Japanese and Korean needs MeCab."""
    autocast_dtype(cfg.train.precision, choose_device(cfg.train.device))
    if cfg.train.gradient_checkpointing and cfg.model.arch != "transformer":
        raise ConfigError(f"train.gradient_checkpointing: for the Transformer only (the {cfg.model.arch}'s "
                          "layers run as one fused operation)")
    if cfg.data.dev is None:
        return
    tokenizer = bleu_tokenizer(cfg.data.tgt_lang)
    extra = missing_extra(tokenizer)
    if extra is not None:
        raise ConfigError(f"data.tgt_lang: {cfg.data.tgt_lang!r}: validation scores BLEU with sacrebleu's "
                          f"{tokenizer} tokenizer, which needs MeCab (pip install '{extra}')")


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX), read from the kernel's CPU flags
    (``/proc/cpuinfo``); elsewhere, or unreadable, False. Without it bf16 is emulated and slower than fp32."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def chosen_precision(precision: str, device: torch.device) -> str:
    """``train.precision`` as it runs on ``device``: ``auto`` is the fastest path that trains as well, bf16
    on CUDA and on a CPU with native bf16 (``native_bf16``: about 1.2x on the toy Transformer, 1.8x on the
    Multi30k one, docs/benchmarks.md), fp32 on any other CPU."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" or native_bf16() else "fp32"


def describe_precision(precision: str, device: torch.device) -> str:
    """What training prints and logs: the precision that runs, the setting that chose it, and a warning for
    bf16 asked for on a CPU that only emulates it."""
    chosen = chosen_precision(precision, device)
    slow = chosen == "bf16" and device.type == "cpu" and not native_bf16()
    warning = "; no native bf16 on this CPU (AVX-512 BF16 or AMX): emulated, slower than fp32" if slow else ""
    return f"{chosen} (train.precision {precision}{warning})"


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """``train.precision`` on ``device``: the autocast dtype, or None for fp32."""
    precision = chosen_precision(precision, device)
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("train.precision: fp16 needs CUDA (its gradient scaler); on the CPU use bf16 or "
                          "fp32")
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def initial_weights(cfg: Config, run: RunDir, main: bool) -> tuple[dict, Path]:
    """``train.init_from``: the checkpoint's weights, after checking that its model config is this run's,
    and its tokenizer put in the run folder (by the ``main`` process), or checked against the one there."""
    model, tokenizer, init_cfg, path = load_model(cfg.train.init_from)
    changes = diff_dicts(init_cfg.model.model_dump(mode="json"), cfg.model.model_dump(mode="json"))
    if changes:
        raise ConfigError(f"train.init_from {path}: its model config differs from this run's "
                          f"({'; '.join(changes[:4])}); fine-tuning keeps the architecture")
    if run.tokenizer.exists():
        here = load_tokenizer(run.tokenizer)
        if here.fingerprint() != tokenizer.fingerprint():
            raise ConfigError(f"train.init_from {path}: {run.tokenizer} holds another tokenizer than the "
                              "checkpoint's; use another --run-dir")
    elif main:
        write_tokenizer(tokenizer, cfg.tokenizer.model_dump(mode="json", exclude={"sampling"}), run)
    return model.state_dict(), path


def data_to_prepare(cfg: Config, run: RunDir) -> bool:
    """Whether ``prepare`` must run: the run folder lacks prepared data; a ConfigError when it holds data
    prepared with other data or tokenizer settings. A corpus inside the run folder (``attnmt distill``'s) is
    named relative to it, so a run folder moved elsewhere goes on."""
    # config.yaml is written last, so without it an earlier prepare stopped halfway: prepare again.
    if not run.split("train").exists() or not run.tokenizer.exists() or not run.config.exists():
        return True
    stored = load_config(run.config)
    sections, ignored = ("data", "tokenizer"), {"sampling"}  # tokenizer.sampling changes the training only
    then, now = ({s: _inside_run(getattr(c, s).model_dump(mode="json", exclude=ignored), root)
                  for s in sections} for c, root in ((stored, stored.train.run_dir), (cfg, run.root)))
    changes = diff_dicts(then, now)
    if changes:
        raise ConfigError(f"{run.root}: this run was prepared with other data or tokenizer settings "
                          f"({'; '.join(changes[:3])}); set them back to go on with this run (a default "
                          "that follows the languages may have changed: tokenizer.normalization for CJK), "
                          "or use another --run-dir")
    return False


def _inside_run(value, root: Path | None):
    """``value`` (a config section as JSON) with each path inside the run folder ``root`` written
    ``RUN/...``."""
    if isinstance(value, dict):
        return {key: _inside_run(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [_inside_run(item, root) for item in value]
    if isinstance(value, str) and root is not None and Path(value).is_relative_to(Path(root).resolve()):
        return str(Path("RUN") / Path(value).relative_to(Path(root).resolve()))
    return value


def run_tokenizer(run: RunDir, found: tuple[Path, dict] | None) -> Tokenizer:
    """The run folder's tokenizer, the very one its checkpoint (``found``: the one a run resumes from, None
    for a fresh run) was trained with, compared by hash before sentencepiece parses a byte (crafted models
    have crashed it). A ``tokenizer/`` and ``checkpoints/`` from two runs is the run folder's parts that
    disagree: a DataError naming both (exit 3), as a split from another run is (``batching.load_split``).
    A tokenizer that fails its own sha256s, or a checkpoint with no usable record of its tokenizer, stays
    a CheckpointError (exit 4)."""
    recorded = recorded_tokenizer(found[1]) if found is not None else None
    made_with = recorded_sha256(recorded)
    if made_with is not None and made_with != folder_sha256(run.tokenizer):
        raise DataError(f"{run.tokenizer}: another tokenizer than the one {found[0]} was trained with; copy "
                        "tokenizer/ and checkpoints/ together from one run, or train in another --run-dir")
    return load_tokenizer(run.tokenizer, recorded)


def guided_links(cfg: Config, run: RunDir, train_data: EncodedSplit,
                 tokenizer: Tokenizer) -> tuple[list, str]:
    """``train.alignment``'s links of every training pair, in pieces, checked against the corpus; and the
    line that says how many pairs have them."""
    try:
        stats = {s["name"]: s for s in read_json(run.stats, DataError, list)}
        read = int(stats["train"]["read"])
    except (DataError, ValueError, KeyError, TypeError):
        raise DataError(f"{run.stats}: unreadable, or it lacks the training corpus's line count; "
                        "run attnmt prepare again") from None
    alignment = cfg.train.alignment
    guided = piece_alignments(alignment, train_data, tokenizer, read, describe_source(cfg.data.train))
    supervised = sum(1 for x in guided.links if len(x))
    skipped = (f"; {guided.skipped} left out (their pieces make other words than their spaces: "
               f"first at line {guided.first_skipped})" if guided.skipped else "")
    who = (f"an alignment layer on decoder layer {alignment.layer}" if alignment.module == "layer" else
           f"decoder layer {alignment.layer}, heads {alignment.heads}")
    return guided.links, (f"guided alignment: {supervised} of {len(guided.links)} training pairs have "
                          f"links{skipped}; {who}, weight {alignment.weight:g}")


def load_initial(model: torch.nn.Module, state: dict, path: Path) -> None:
    """``train.init_from``'s weights into ``model``; a model given an alignment layer that the checkpoint
    lacks keeps its own, newly drawn (the layer is added on top of a trained model)."""
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("aligner.")]
    if missing or result.unexpected_keys:
        raise CheckpointError(f"train.init_from {path}: its weights do not fit this run's model "
                              f"(missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})")


def resampler(cfg: Config, train_data: EncodedSplit, tokenizer: Tokenizer) -> SubwordSampler | None:
    """``tokenizer.sampling``: the sampler that segments the training pairs anew each epoch; else None."""
    if cfg.tokenizer.sampling is None:
        return None
    return SubwordSampler(tokenizer, train_data, cfg.tokenizer.sampling, cfg.train.seed, longest_sampled(cfg))


def train_sampler(cfg: Config, train: EncodedSplit, world_size: int, rank: int,
                  resampled: SubwordSampler | None = None) -> TokenBatchSampler:
    """The training batches: ``train.max_tokens`` each, dealt to ranks, whole accumulation steps; several
    corpora with weights (``data.train``'s) drawn by them (``batching.corpus_draws``). With subword sampling
    (``resampled``) planned at ``train.max_tokens`` over its measured lengthening, so that a sampled batch
    fits the budget as often as a plain one does."""
    weights, corpora = cfg.data.weights(), train.corpora or [len(train)]
    if weights is not None and len(corpora) != len(weights):
        raise DataError(f"the prepared training data holds {len(corpora)} corpora, the config lists "
                        f"{len(weights)}: run attnmt prepare again")
    budget = cfg.train.max_tokens
    if resampled is not None:
        budget = max(1, int(budget / resampled.lengthening()))
    return TokenBatchSampler(train.lengths, budget, cfg.train.seed, num_replicas=world_size,
                             rank=rank, multiple_of=cfg.train.accum_steps,
                             corpora=corpora if weights is not None else None, weights=weights)
