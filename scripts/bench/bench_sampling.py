"""Subword regularisation at equal minutes: one config trained twice for the same training time, without
and with ``tokenizer.sampling``, then both scored on its test set (``attnmt eval``: BLEU, chrF).

    python scripts/bench/bench_sampling.py configs/multi30k_de_en_transformer.yaml --minutes 30 \\
        --alpha 0.1 --nbest 16 --run-root runs/bench_sampling/multi30k_de_en
    python scripts/bench/bench_sampling.py configs/tatoeba_zh_en_transformer.yaml --minutes 30 \\
        --alpha 0.1 --nbest 16 --run-root runs/bench_sampling/tatoeba_zh_en

The data is prepared once (``attnmt prepare``, not timed) and copied into both run folders: sampling changes
no prepared file. Each run trains in a child process (``attnmt train``) until ``train.max_minutes`` =
``--minutes`` of training time as the trainer counts it (its validations included), with ``max_epochs`` and
``max_steps`` lifted so that the clock alone stops it; the rest of the config (``average_last`` too) is kept.
The runs go one after the other, never side by side: give the machine to them alone. The test set is the
config's ``data.test``, read and cleaned as prepare reads it, translated by each run folder's best checkpoint
with the config's decode settings. A run folder that exists is continued (a run that finished has nothing
to do), so an interrupted benchmark goes on where it stopped; remove ``--run-root`` to start again.
With ``--draws-only`` it stops after preparing and prints what the draws cost: the pieces' lengthening
and the CPU milliseconds per sentence drawn (also in the full run's table note). ``--smoke`` is CI's smoke
run (``tests/scripts/test_scripts_smoke.py``, on a tiny config for a moment), its numbers meaningless:
attnmt's commands run in this process instead of a child each (``benchlib.in_process``).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, attnmt, eval_scores, in_process, run_main, save_rows
from scriptargs import ConfigFile, Number, OutputFile, OutputFolder, ScriptParser, guarded

from attnmt.errors import ConfigError


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def write_test_set(config: Path, overrides: list[str], root: Path) -> tuple[Path, Path, int]:
    """The config's test pairs, cleaned as prepare cleans them, as two files under ``root``."""
    from attnmt.config.schema import load_config
    from attnmt.data.readers import read_corpus

    cfg = load_config(config, overrides)
    corpus = read_corpus(cfg.data.test, "test")
    src, ref = root / "test.src", root / "test.ref"
    src.write_text("".join(f"{line}\n" for line in corpus.src), encoding="utf-8")
    ref.write_text("".join(f"{line}\n" for line in corpus.tgt), encoding="utf-8")
    return src, ref, len(corpus)


def progress_of(run: Path) -> dict:
    """The latest checkpoint's counters: steps, epochs, tokens and seconds of training."""
    from attnmt.models.checkpoint import load_checkpoint, read_pointer
    from attnmt.runfiles import RunDir

    latest = read_pointer(RunDir(run), "latest")
    progress = load_checkpoint(run / "checkpoints" / latest["file"])["progress"]
    best = read_pointer(RunDir(run), "best")
    return {"steps": progress["step"], "epochs": progress["epoch"], "tokens": progress["tokens_seen"],
            "minutes": progress["train_seconds"] / 60, "best": best.get("file", latest["file"])}


def sampled_length(config: Path, overrides: list[str], run: Path,
                   examples: int = 2000) -> tuple[float, float]:
    """How much longer sampling makes the training pairs: their pieces (both sides) at epoch 0 over their
    deterministic pieces, on the first ``examples`` pairs; and the draws' CPU milliseconds per sentence."""
    from attnmt.config.schema import load_config
    from attnmt.data.batching import load_split
    from attnmt.data.tokenizer import load_tokenizer
    from attnmt.runfiles import RunDir
    from attnmt.training.runstart import resampler

    split = load_split(RunDir(run), "train")
    sampler = resampler(load_config(config, overrides), split, load_tokenizer(RunDir(run).tokenizer))
    rows = range(min(examples, len(split)))
    sampler.pair(0, 0)  # the model's tables are read once, before the clock
    started = time.process_time()
    drawn = sum(len(src) + len(tgt) for src, tgt in (sampler.pair(i, 0) for i in rows))
    cost = (time.process_time() - started) * 1000 / (2 * len(rows))
    rows_array = np.arange(len(rows))
    plain = int(split.src_ids.lengths(rows_array).sum() + split.tgt_ids.lengths(rows_array).sum())
    return drawn / plain, cost


def draws_only(config: Path, overrides: list[str], prepared: Path) -> None:
    """``--draws-only``: the lengthening and the draws' cost on the prepared data, no training."""
    longer, cost = sampled_length(config, overrides, prepared)
    print(f"{config.name}, {', '.join(overrides)}: pieces {longer:.3f}x, {cost:.3f} ms of CPU per sentence "
          "drawn (the first 2,000 pairs' sides, epoch 0)")


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("config", type=ConfigFile(lambda args: variants(args)["sampling"]))
    parser.add_argument("--minutes", type=Number(float, above=0), required=True,
                        help="Training time of each run.")
    parser.add_argument("--alpha", type=Number(float), default=0.1,
                        help="tokenizer.sampling.alpha (unigram: the inverse temperature; bpe, with "
                             "--set tokenizer.model_type=bpe: the probability of dropping a merge).")
    parser.add_argument("--nbest", type=Number(int), default=None,
                        help="tokenizer.sampling.nbest (default: the config's default, 16).")
    parser.add_argument("--run-root", type=OutputFolder(), default=None,
                        help="Where the prepared data, the two run folders and the test files go "
                             "(default: runs/bench_sampling/<config name>).")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="Another config override for both runs (repeatable), e.g. train.device=cuda.")
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    parser.add_argument("--smoke", action="store_true",
                        help="CI's smoke run (its numbers mean nothing): attnmt's commands in this process "
                        "instead of a child each")
    parser.add_argument("--draws-only", action="store_true",
                        help="Only prepare and measure the draws (pieces, CPU ms per sentence); no training.")
    parser.checks.append(check_test_set)
    return parser


def sampling_settings(args) -> list[str]:
    """The ``tokenizer.sampling`` overrides of the sampling run."""
    found = [f"tokenizer.sampling.alpha={args.alpha}"]
    if args.nbest is not None:
        found.append(f"tokenizer.sampling.nbest={args.nbest}")
    return found


def variants(args) -> dict[str, list[str]]:
    """Each run's overrides: the user's, the clock's, and for the sampling run its settings."""
    clock = [f"train.max_minutes={args.minutes}", "train.max_epochs=1000000", "train.max_steps=0"]
    return {"plain": args.overrides + clock, "sampling": args.overrides + clock + sampling_settings(args)}


def check_test_set(args) -> None:
    """Both runs' settings load (the config's check loads the sampling run's), and there is a test set."""
    from attnmt.config.schema import load_config

    if load_config(args.config, variants(args)["plain"]).data.test is None:
        raise ConfigError(f"{args.config}: the config has no data.test to score on")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    in_process(args.smoke)
    root = (args.run_root or REPO / "runs" / "bench_sampling" / args.config.stem).resolve()
    root.mkdir(parents=True, exist_ok=True)
    config = args.config.resolve()
    sampling = sampling_settings(args)
    runs = variants(args)
    write_test_set(config, runs["sampling"], root)
    prepared = root / "prepared"
    if not (prepared / "config.yaml").exists():
        attnmt("prepare", config, "--run-dir", prepared, *sets(args.overrides))
    if args.draws_only:
        return draws_only(config, args.overrides + sampling, prepared)
    rows = []
    for name, overrides in runs.items():
        run = root / name
        if not run.exists():
            shutil.copytree(prepared, run, ignore=shutil.ignore_patterns(".lock"))
        attnmt("train", config, "--run-dir", run, *sets(overrides))
        scores = eval_scores(run, root / "test.src", root / "test.ref")
        longer, cost = sampled_length(config, overrides, run) if name == "sampling" else (1.0, 0.0)
        rows.append({"run": name, "settings": sampling if name == "sampling" else [], **progress_of(run),
                     "pieces": round(longer, 3), "draw_ms": round(cost, 3), "bleu": scores["bleu"]["score"],
                     "chrf": scores["chrf"]["score"], "signature": scores["bleu"]["signature"]})
    print(f"\n{args.config.name}, {args.minutes:g} minutes each; test set {root / 'test.src'}")
    print("\n| run | sampling | pieces | steps | epochs | minutes | BLEU | chrF | checkpoint scored |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['run']} | {', '.join(row['settings']) or 'off'} | {row['pieces']:.2f}x | "
              f"{row['steps']} | {row['epochs']} | {row['minutes']:.1f} | {row['bleu']:.2f} | "
              f"{row['chrf']:.2f} | {row['best']} |")
    print("\npieces: the training pairs' pieces at epoch 0 over their deterministic pieces "
          f"(the first 2,000 pairs), drawn at {rows[-1]['draw_ms']:.3f} ms of CPU per sentence")
    print(f"\nBLEU: {rows[0]['signature']}")
    save_rows(rows, args.json)


if __name__ == "__main__":
    run_main(main)
