"""``attnmt prepare``: read and clean the corpora, train or load the tokenizer, encode into the run folder.

Text -> ``data.read_corpus`` -> ``tokenizer`` -> length filters -> Arrow datasets in ``run/data/<split>``
(columns ``src``, ``tgt``, ``src_ids``, ``tgt_ids``; memory-mapped when training reads them back).
Only the training split is filtered by length: dev and test are scored on every sentence.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from .config import Config
from .data import ParallelText, read_corpus
from .errors import CheckpointError, ConfigError, DataError
from .runfiles import (
    RunDir,
    atomic_write_bytes,
    atomic_write_text,
    check_run_folder,
    replace_dir,
    write_marker,
)
from .tokenizer import META_FILE, UNK_ID, Tokenizer, load_external, load_tokenizer, train_tokenizer

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
    tokenizer_trained: bool
    src_vocab_size: int
    tgt_vocab_size: int
    joint: bool


PERCENTILES = (50, 90, 99, 100)


def _length_stats(ids: list[list[int]]) -> tuple[int, dict[str, int], float]:
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    total = int(lengths.sum())
    unk = sum(x.count(UNK_ID) for x in ids)
    pct = {f"p{p}" if p < 100 else "max": int(np.percentile(lengths, p)) if len(lengths) else 0
           for p in PERCENTILES}
    return total, pct, (unk / total if total else 0.0)


def encode_split(corpus: ParallelText, tokenizer: Tokenizer, max_len: int | None,
                 max_ratio: float | None) -> tuple[dict, SplitStats]:
    """Encode a corpus; with ``max_len``/``max_ratio`` drop pairs that are too long or too unequal."""
    src_ids = tokenizer.encode_src(corpus.src)
    tgt_ids = tokenizer.encode_tgt(corpus.tgt)
    dropped = dict(corpus.dropped)
    keep = list(range(len(src_ids)))
    if max_len is not None:
        too_long = [i for i in keep if len(src_ids[i]) > max_len or len(tgt_ids[i]) > max_len]
        if too_long:
            dropped[f"longer than {max_len} pieces"] = len(too_long)
            keep = [i for i in keep if len(src_ids[i]) <= max_len and len(tgt_ids[i]) <= max_len]
    if max_ratio is not None:
        ratio = max_ratio

        def unequal(i: int) -> bool:
            a, b = len(src_ids[i]), len(tgt_ids[i])
            return max(a, b) > ratio * min(a, b)

        bad = [i for i in keep if unequal(i)]
        if bad:
            dropped[f"length ratio over {max_ratio:g}"] = len(bad)
            keep = [i for i in keep if not unequal(i)]
    columns = {
        "src": [corpus.src[i] for i in keep],
        "tgt": [corpus.tgt[i] for i in keep],
        "src_ids": [src_ids[i] for i in keep],
        "tgt_ids": [tgt_ids[i] for i in keep],
        "line": [corpus.lines[i] for i in keep],
    }
    if corpus.alignments is not None:
        columns["alignment"] = [corpus.alignments[corpus.lines[i] - 1] for i in keep]
    src_tokens, src_pct, src_unk = _length_stats(columns["src_ids"])
    tgt_tokens, tgt_pct, tgt_unk = _length_stats(columns["tgt_ids"])
    stats = SplitStats(corpus.name, corpus.read, len(keep), dropped, src_tokens, tgt_tokens, src_pct, tgt_pct,
                       src_unk, tgt_unk)
    return columns, stats


def obtain_tokenizer(cfg: Config, run: RunDir, train: ParallelText) -> tuple[Tokenizer, bool]:
    """The run's tokenizer: a user-given model, the one already in the run folder, or a new one."""
    settings = cfg.tokenizer.model_dump(mode="json")
    if cfg.tokenizer.src_model is not None:
        if not cfg.tokenizer.joint and cfg.tokenizer.tgt_model is None:
            raise ConfigError("tokenizer.tgt_model: required when tokenizer.joint is false "
                              "and src_model is given")
        tokenizer = load_external(cfg.tokenizer.src_model,
                                  None if cfg.tokenizer.joint else cfg.tokenizer.tgt_model)
        return tokenizer, False
    meta_path = run.tokenizer / META_FILE
    if meta_path.exists():
        try:
            stored = json.loads(meta_path.read_text(encoding="utf-8")).get("settings", {})
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{meta_path}: unreadable tokenizer metadata "
                                  f"({type(e).__name__})") from None
        # A key that a tokenizer folder from an older attnmt does not record had its old default then.
        changed = [f"{k}: {stored.get(k, LEGACY_SETTINGS.get(k))!r} -> {v!r}" for k, v in settings.items()
                   if stored.get(k, LEGACY_SETTINGS.get(k)) != v]
        if changed:
            raise ConfigError(
                f"{run.tokenizer}: this run's tokenizer was trained with other settings "
                f"({'; '.join(changed)}); use another --run-dir or remove that folder"
            )
        return load_tokenizer(run.tokenizer), False
    tokenizer = train_tokenizer(train.src, train.tgt, cfg.tokenizer, seed=cfg.train.seed)
    write_tokenizer(tokenizer, settings, run)
    return tokenizer, True


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


def save_split(columns: dict, path: Path) -> None:
    """Write one encoded split as an Arrow dataset, complete or not at all."""
    import datasets

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    datasets.Dataset.from_dict(columns).save_to_disk(str(tmp))
    replace_dir(tmp, path)


def write_resolved_config(cfg: Config, run: RunDir) -> None:
    text = "# resolved by attnmt: every default filled in, every path absolute\n"
    text += yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)
    atomic_write_text(run.config, text)


def prepare(cfg: Config, run: RunDir) -> PrepareReport:
    """Read, clean, tokenize and encode every split of ``cfg.data`` into ``run`` (the caller holds its
    lock). A folder that is not a run folder and not empty is refused before anything is read, and so is a
    corpus file inside the folders of the run that prepare replaces."""
    check_run_folder(run)
    check_sources_outside(cfg, run)
    sources = {"train": cfg.data.train, "dev": cfg.data.dev, "test": cfg.data.test}
    corpora = {name: read_corpus(source, name) for name, source in sources.items() if source is not None}
    train = corpora["train"]
    if len(train) == 0:
        raise DataError(f"train: no training pairs left after cleaning ({_reasons(train.dropped)})")
    # Before the tokenizer is trained on what is left: a run folder keeps its tokenizer for later runs.
    _check_dropped(train.read, len(train), train.dropped, cfg.data.max_dropped_fraction)
    run.root.mkdir(parents=True, exist_ok=True)
    write_marker(run)  # before anything else is written into the folder
    tokenizer, trained = obtain_tokenizer(cfg, run, train)

    stats = []
    for name, corpus in corpora.items():
        is_train = name == "train"
        columns, split_stats = encode_split(
            corpus, tokenizer, cfg.data.max_len if is_train else None,
            cfg.data.max_ratio if is_train else None
        )
        if is_train:
            if split_stats.kept == 0:
                raise DataError(f"train: no training pairs left ({_reasons(split_stats.dropped)})")
            _check_dropped(split_stats.read, split_stats.kept, split_stats.dropped,
                           cfg.data.max_dropped_fraction)
        elif split_stats.kept == 0:
            raise DataError(f"{name}: no pairs left after cleaning ({_reasons(split_stats.dropped)})")
        save_split(columns, run.split(name))
        stats.append(split_stats)

    atomic_write_text(run.stats, json.dumps([s.__dict__ for s in stats], indent=2, ensure_ascii=False))
    write_resolved_config(cfg, run)
    return PrepareReport(run.root, stats, trained, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size,
                         tokenizer.joint)


def check_sources_outside(cfg: Config, run: RunDir) -> None:
    """A ConfigError naming the key of a corpus file that lies in ``run``'s data, tokenizer or checkpoint
    folders: preparing replaces those folders whole, and the corpus with them."""
    replaced = [os.path.realpath(folder) for folder in (run.data, run.tokenizer, run.checkpoints)]
    for split in ("train", "dev", "test"):
        source = getattr(cfg.data, split)
        for key, value in source if source is not None else ():  # a pydantic model yields (key, value)
            for path in value if isinstance(value, list) else [value]:
                if isinstance(path, Path) and any(Path(os.path.realpath(path)).is_relative_to(folder)
                                                  for folder in replaced):
                    raise ConfigError(f"data.{split}.{key}: {path} is inside the run folder {run.root}'s "
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

