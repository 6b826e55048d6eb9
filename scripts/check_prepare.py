"""The streamed prepare against the list-based one it replaced, on any config's corpora.

    python scripts/check_prepare.py configs/multi30k_de_en_transformer.yaml --workers 2
    python scripts/check_prepare.py configs/toy_transformer.yaml --set tokenizer.sample_size=500

``attnmt prepare`` (spooled, chunked, in worker processes) writes a run folder; then the corpora are read
again the way prepare read them before it streamed (``data.read_corpus`` into lists, the tokenizer trained
by ``tokenizer.train_tokenizer`` on the whole lists, every sentence encoded at once, the length filters
and statistics over lists with ``np.percentile``), and the two must agree: the same tokenizer bytes, the
same token ids, lines, texts and gold alignments in every split, the same statistics. Prints what differs
and exits 1, or prints one line and exits 0. ``tests/data/test_streamed_prepare.py`` runs ``compare`` on the
toy task and on a corpus full of what cleaning drops.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from scriptargs import ConfigFile, Number, ScriptParser, guarded

from attnmt.config.schema import Config, load_config
from attnmt.data.encoded import open_split
from attnmt.data.prepare import prepare
from attnmt.data.readers import read_corpus
from attnmt.data.tokenizer import UNK_ID, train_tokenizer
from attnmt.runfiles import RunDir


def list_prepare(cfg: Config) -> tuple[dict[str, bytes], dict[str, dict], list[dict]]:
    """What the list-based prepare made: the tokenizer's model files, each split's columns, the statistics."""
    sources = {"train": cfg.data.train, "dev": cfg.data.dev, "test": cfg.data.test}
    corpora = {name: read_corpus(source, name) for name, source in sources.items() if source is not None}
    train = corpora["train"]
    tokenizer = train_tokenizer(train.src, train.tgt, cfg.tokenizer, seed=cfg.train.seed)
    splits, stats = {}, []
    for name, corpus in corpora.items():
        src_ids, tgt_ids = tokenizer.encode_src(corpus.src), tokenizer.encode_tgt(corpus.tgt)
        dropped, keep = dict(corpus.dropped), list(range(len(src_ids)))
        max_len, ratio = (cfg.data.max_len, cfg.data.max_ratio) if name == "train" else (None, None)
        if max_len is not None:
            long = [i for i in keep if len(src_ids[i]) > max_len or len(tgt_ids[i]) > max_len]
            if long:
                dropped[f"longer than {max_len} pieces"] = len(long)
            keep = [i for i in keep if i not in set(long)]
        if ratio is not None:
            sizes = {i: (len(src_ids[i]), len(tgt_ids[i])) for i in keep}
            unequal = {i for i in keep if max(sizes[i]) > ratio * min(sizes[i])}
            if unequal:
                dropped[f"length ratio over {ratio:g}"] = len(unequal)
            keep = [i for i in keep if i not in unequal]
        columns = {"src_ids": [src_ids[i] for i in keep], "tgt_ids": [tgt_ids[i] for i in keep],
                   "src": [corpus.src[i] for i in keep], "tgt": [corpus.tgt[i] for i in keep],
                   "line": [corpus.lines[i] for i in keep]}
        if corpus.alignments is not None:
            columns["alignment"] = [corpus.alignments[corpus.lines[i] - 1] for i in keep]
        splits[name] = columns
        stats.append(_stats(name, corpus.read, dropped, columns))
    return tokenizer.files(), splits, stats


def _stats(name: str, read: int, dropped: dict, columns: dict) -> dict:
    out = {"name": name, "read": read, "kept": len(columns["line"]), "dropped": dropped}
    for side in ("src", "tgt"):
        ids = columns[f"{side}_ids"]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        total = int(lengths.sum())
        out[f"{side}_tokens"] = total
        out[f"{side}_percentiles"] = {f"p{p}" if p < 100 else "max": int(np.percentile(lengths, p))
                                      if len(ids) else 0 for p in (50, 90, 99, 100)}
    for side in ("src", "tgt"):
        total = out[f"{side}_tokens"]
        unknown = sum(x.count(UNK_ID) for x in columns[f"{side}_ids"])
        out[f"{side}_unk_rate"] = unknown / total if total else 0.0
    return out


def compare(cfg: Config, run: Path) -> list[str]:
    """What differs between the prepared ``run`` and the list-based prepare of ``cfg`` (empty: nothing)."""
    files, splits, stats = list_prepare(cfg)
    problems = [f"tokenizer {name} differs" for name, data in files.items()
                if (run / "tokenizer" / name).read_bytes() != data]
    for name, columns in splits.items():
        split = open_split(run / "data" / name, name)
        got = {"src_ids": list(split.src_ids), "tgt_ids": list(split.tgt_ids), "src": split.src_text,
               "tgt": split.tgt_text, "line": split.lines.tolist()}
        if "alignment" in columns:
            got["alignment"] = split.gold
        problems += [f"{name}: column {key} differs" for key in columns if got[key] != columns[key]]
    written = json.loads((run / "data" / "stats.json").read_text(encoding="utf-8"))
    if written != stats:
        problems.append(f"statistics differ:\n  streamed {written}\n  lists    {stats}")
    return problems


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=ConfigFile(lambda args: args.sets))
    parser.add_argument("--set", dest="sets", action="append", default=[], help="KEY=VALUE overrides")
    parser.add_argument("--workers", type=Number(int, low=1), default=None)
    return parser


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cfg = load_config(args.config, args.sets)
    with tempfile.TemporaryDirectory(prefix="check-prepare-") as tmp:
        run = Path(tmp) / "run"
        prepare(cfg, RunDir(run), args.workers)
        problems = compare(cfg, run)
    if problems:
        print("\n".join(problems))
        sys.exit(1)
    print(f"streamed prepare == list-based prepare ({args.config})")


if __name__ == "__main__":
    main()
