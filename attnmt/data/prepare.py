"""``attnmt prepare``: read and clean the corpora, train or load the tokenizer, encode into the run folder.

Each split streams through ``spool`` a chunk at a time, in ``workers`` processes: text ->
``data.raw_pairs`` -> ``data.clean`` -> a spool file -> (the tokenizer, trained on a sample of the
training spool) -> encoded, length-filtered and counted -> ``encoded.SplitWriter`` -> ``run/data/<split>``
(flat token arrays, memory-mapped when training reads them back). Memory does not grow with the corpus.
Only the training split is filtered by length: dev and test are scored on every sentence. ``config.yaml``
is removed before the first split is replaced and written again last, so that a prepare killed on the
way leaves a folder that ``runstart.data_to_prepare`` prepares again.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config.jsonfile import read_json
from ..config.schema import Config
from ..errors import CheckpointError, ConfigError, DataError
from ..runfiles import (
    RunDir,
    atomic_write_bytes,
    atomic_write_text,
    check_run_folder,
    keep_attributes,
    replace_dir,
    write_marker,
)
from .encoded import SplitWriter, ids_dtype
from .pool import default_workers
from .spool import Filters, Spooled, encode_spooled, spool_split, tokenizer_sample
from .tokenizer import META_FILE, Tokenizer, load_external, load_tokenizer, train_on_samples

log = logging.getLogger(__name__)

# Tokenizer settings added since the first tokenizer.json was written, and the behaviour before them.
LEGACY_SETTINGS = {"byte_fallback": False, "normalization": "nmt_nfkc"}


@dataclass
class SplitStats:
    name: str
    read: int
    kept: int
    dropped: dict[str, int] = field(default_factory=dict)
    src_tokens: int = 0
    tgt_tokens: int = 0
    src_percentiles: dict[str, int] = field(default_factory=dict)
    tgt_percentiles: dict[str, int] = field(default_factory=dict)
    src_unk_rate: float = 0.0
    tgt_unk_rate: float = 0.0


@dataclass
class PrepareReport:
    run_dir: Path
    splits: list[SplitStats]
    tokenizer: str
    """How the tokenizer was obtained: loaded, or trained on how many sentences."""
    src_vocab_size: int
    tgt_vocab_size: int
    joint: bool


def obtain_tokenizer(cfg: Config, run: RunDir, train: Spooled) -> tuple[Tokenizer, str]:
    """The run's tokenizer: a user-given model, the one already in the run folder, or a new one trained on
    a sample of the training spool; and how it was obtained, in words."""
    settings = cfg.tokenizer.model_dump(mode="json", exclude={"sampling"})  # sampling trains nothing here
    if cfg.tokenizer.src_model is not None:
        if not cfg.tokenizer.joint and cfg.tokenizer.tgt_model is None:
            raise ConfigError("tokenizer.tgt_model: required when tokenizer.joint is false "
                              "and src_model is given")
        tokenizer = load_external(cfg.tokenizer.src_model,
                                  None if cfg.tokenizer.joint else cfg.tokenizer.tgt_model)
        return tokenizer, "loaded"
    meta_path = run.tokenizer / META_FILE
    if meta_path.exists():
        stored = read_json(meta_path, CheckpointError).get("settings", {})
        if not isinstance(stored, dict):
            raise CheckpointError(f"{meta_path}: settings must be a JSON object")
        # A key that a tokenizer folder from an older attnmt does not record had its old default then.
        before = {k: stored.get(k, LEGACY_SETTINGS.get(k)) for k in settings}
        changed = [k for k, v in settings.items() if before[k] != v]
        if changed:  # a default that follows the language may have changed since (normalization, for CJK)
            raise ConfigError(
                f"{run.tokenizer}: this run's tokenizer was trained with other settings "
                f"({'; '.join(f'{k}: {before[k]!r} -> {settings[k]!r}' for k in changed)}); to go on with it "
                f"set {', '.join(f'tokenizer.{k}: {json.dumps(before[k])}' for k in changed)}, or use "
                "another --run-dir"
            )
        return load_tokenizer(run.tokenizer), "loaded"
    samples = tokenizer_sample(train, cfg.tokenizer, cfg.train.seed)
    tokenizer = train_on_samples(samples, cfg.tokenizer, seed=cfg.train.seed,
                                 symbols=cfg.data.control_tokens())
    write_tokenizer(tokenizer, settings, run)
    population = train.kept * (2 if cfg.tokenizer.joint else 1)
    each = "" if cfg.tokenizer.joint else " per side"
    return tokenizer, (f"trained on {len(samples[0]):,} of {population:,} sentences{each} "
                       f"(tokenizer.sample_size {cfg.tokenizer.sample_size:,})")


def write_tokenizer(tokenizer: Tokenizer, settings: dict, run: RunDir) -> None:
    """The tokenizer's model files and its metadata (``settings``: the config's tokenizer section) as the
    run folder's ``tokenizer/``, complete or not at all."""
    tmp = run.root / f".tokenizer.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, data in tokenizer.files().items():
        atomic_write_bytes(tmp / name, data)  # fsynced, like every file of the run
    atomic_write_text(tmp / META_FILE, json.dumps(tokenizer.meta(settings), indent=2))
    replace_dir(tmp, run.tokenizer)


def write_resolved_config(cfg: Config, run: RunDir) -> None:
    text = "# resolved by attnmt: every default filled in, every path absolute\n"
    text += yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)
    atomic_write_text(run.config, text)


def prepare(cfg: Config, run: RunDir, workers: int | None = None) -> PrepareReport:
    """Read, clean, tokenize and encode every split of ``cfg.data`` into ``run`` (the caller holds its
    lock), in ``workers`` processes (default: one per core). A folder that is not a run folder and not empty
    is refused before anything is read, and so is a corpus file inside the folders of the run that prepare
    replaces. Nothing of the run is replaced before every split has been read and encoded."""
    if cfg.data.train is None:
        raise ConfigError("data.train: required to prepare and train (this config names no training corpus: "
                          "an imported model's is for translating; fine-tune it with a config of your own, "
                          "train.init_from naming it)")
    check_run_folder(run)
    check_sources_outside(cfg, run)
    workers = workers or default_workers()
    data = cfg.data
    sources = {"train": data.corpora(), "dev": data.dev, "test": data.test}
    prefixes = {name: [data.source_prefix(s) for s in (source if isinstance(source, list) else [source])]
                for name, source in sources.items() if source is not None}
    work = run.data / f".prepare.tmp-{os.getpid()}"
    made_data = not run.data.exists()
    user_set = run.config.stat() if run.config.is_file() else None  # its mode, kept when it is written again
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    writers: dict[str, SplitWriter] = {}
    try:
        spooled = {name: spool_split(source, name, work / f"{name}.tsv", workers, prefixes[name])
                   for name, source in sources.items() if source is not None}
        train = spooled["train"]
        if train.kept == 0:
            raise DataError(f"train: no training pairs left after cleaning ({_reasons(train.dropped)})")
        # Before the tokenizer is trained on what is left: a run folder keeps its tokenizer for later runs.
        _check_dropped(train.read, train.kept, train.dropped, cfg.data.max_dropped_fraction)
        write_marker(run)  # before anything else is written into the folder
        tokenizer, how = obtain_tokenizer(cfg, run, train)
        check_control_tokens(cfg, tokenizer)
        stats = [_encode(cfg, run, spool, tokenizer, writers, workers) for spool in spooled.values()]
        run.config.unlink(missing_ok=True)  # until it is written again, the folder reads as half-prepared
        for writer in writers.values():
            writer.commit()
    finally:
        for writer in writers.values():
            writer.abandon()
        shutil.rmtree(work, ignore_errors=True)
        if made_data and run.data.exists() and not any(run.data.iterdir()):
            run.data.rmdir()
    atomic_write_text(run.stats, json.dumps([s.__dict__ for s in stats], indent=2, ensure_ascii=False))
    write_resolved_config(cfg, run)
    keep_attributes(run.config, user_set)
    return PrepareReport(run.root, stats, how, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size,
                         tokenizer.joint)


def _encode(cfg: Config, run: RunDir, spooled: Spooled, tokenizer: Tokenizer, writers: dict[str, SplitWriter],
            workers: int) -> SplitStats:
    """Encode one spooled split into a new ``SplitWriter`` (added to ``writers``, not committed); its
    statistics, checked."""
    name, is_train = spooled.name, spooled.name == "train"
    dtype = ids_dtype(max(tokenizer.src_vocab_size, tokenizer.tgt_vocab_size))
    writers[name] = writer = SplitWriter(run.split(name), dtype, spooled.alignments,
                                         tokenizer_sha256=tokenizer.sha256)
    filters = Filters(cfg.data.max_len, cfg.data.max_ratio) if is_train else Filters()
    counts, per_corpus = encode_spooled(spooled, tokenizer, filters, writer, workers)
    if len(per_corpus) > 1:
        writer.corpora = per_corpus
    if is_train:
        if counts.kept == 0:
            raise DataError(f"train: no training pairs left ({_reasons(counts.dropped)})")
        _check_dropped(spooled.read, counts.kept, counts.dropped, cfg.data.max_dropped_fraction)
    elif counts.kept == 0:
        raise DataError(f"{name}: no pairs left after cleaning ({_reasons(counts.dropped)})")
    return SplitStats(name, spooled.read, counts.kept, counts.dropped, counts.tokens["src"],
                      counts.tokens["tgt"], counts.percentiles("src"), counts.percentiles("tgt"),
                      counts.unk_rate("src"), counts.unk_rate("tgt"))


def check_control_tokens(cfg: Config, tokenizer: Tokenizer) -> None:
    """ConfigError naming the setting whose control token (a target language's ``<2xx>``, a tag) the
    tokenizer does not keep as one piece: a tokenizer trained before the corpus was listed, or given."""
    for token in cfg.data.control_tokens():
        if not tokenizer.single_piece(token):
            how = ("tokenizer.src_model was trained without it" if cfg.tokenizer.src_model is not None
                   else "this run's tokenizer was trained before it was listed: prepare another --run-dir")
            raise ConfigError(f"data.train: the control token {token} is not one piece of the tokenizer "
                              f"({how})")


def check_sources_outside(cfg: Config, run: RunDir) -> None:
    """A ConfigError naming the key of a corpus file that lies in ``run``'s data, tokenizer or checkpoint
    folders: preparing replaces those folders whole, and the corpus with them."""
    replaced = [os.path.realpath(folder) for folder in (run.data, run.tokenizer, run.checkpoints)]
    named = [(f"train.{i}." if len(cfg.data.corpora()) > 1 else "train.", source)
             for i, source in enumerate(cfg.data.corpora())]
    named += [(f"{split}.", getattr(cfg.data, split)) for split in ("dev", "test")]
    for name, source in named:
        for key, value in source if source is not None else ():  # a pydantic model yields (key, value)
            for path in value if isinstance(value, list) else [value]:
                if isinstance(path, Path) and any(Path(os.path.realpath(path)).is_relative_to(folder)
                                                  for folder in replaced):
                    raise ConfigError(f"data.{name}{key}: {path} is inside the run folder {run.root}'s "
                                      "own folders, which prepare replaces; keep the corpus outside them")


def _check_dropped(read: int, kept: int, dropped: dict[str, int], max_fraction: float) -> None:
    fraction = 1 - kept / read
    if fraction > max_fraction:
        raise DataError(
            f"train: cleaning dropped {fraction:.0%} of {read} pairs ({_reasons(dropped)}), "
            f"more than data.max_dropped_fraction = {max_fraction:g}"
        )


def _reasons(dropped: dict[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in dropped.items()) or "nothing read"

