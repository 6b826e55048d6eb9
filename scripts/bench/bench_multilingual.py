"""Many languages in one model beside one model per pair, at equal minutes: for each pair (``--pairs de-en
de-fr en-fr``) a single-pair model trained ``--minutes``, and one multilingual model over every pair
trained ``--minutes`` x pairs, all from the same base config (its model and training settings;
``configs/multi30k_multilingual_transformer.yaml``); each pair's BLEU and chrF on the Multi30k test set
(``attnmt eval --tgt-lang``).

    python scripts/bench/bench_multilingual.py --data ../shared/data/multi30k --pairs de-en de-fr en-fr \\
        --minutes 5 --run-root ../runs/bench_multilingual

The runs go one after the other (give the machine to them alone); a run folder that exists is continued, so an
interrupted benchmark goes on where it stopped. The single-pair models keep the base config's vocabulary size;
the multilingual one has one joint tokenizer over every language. ``--smoke`` is CI's smoke run
(``tests/scripts/test_scripts_smoke.py``), its numbers meaningless: the base's smallest model and a 100-piece
vocabulary (``benchlib.smoke_config``), each training a few steps instead of ``--minutes``, and attnmt's
commands run in this process instead of a child each (``benchlib.in_process``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, attnmt, eval_scores, in_process, run_main, save_rows, smoke_config
from scriptargs import (
    ConfigFile,
    InputFolder,
    Number,
    OutputFile,
    OutputFolder,
    Pattern,
    ScriptParser,
    guarded,
)

from attnmt.errors import DataError

BASE = REPO / "configs" / "multi30k_multilingual_transformer.yaml"


def corpus(data: Path, split: str, src: str, tgt: str, langs: bool = True) -> dict:
    files = {"src": str(data / f"{split}.{src}.gz"), "tgt": str(data / f"{split}.{tgt}.gz")}
    return {**files, "src_lang": src, "tgt_lang": tgt} if langs else files


def write_config(base: dict, root: Path, name: str, pairs: list[tuple[str, str]], data: Path,
                 minutes: float, smoke: bool = False) -> Path:
    """The base config with ``pairs`` as its training corpora (a single pair: a plain one-corpus config),
    the first pair's dev and test sets, and ``minutes`` of training (``smoke``: a few steps of its smallest
    model, ``benchlib.smoke_config``)."""
    config = json.loads(json.dumps(base))
    (src, tgt), single = pairs[0], len(pairs) == 1
    config["data"].update(src_lang=src, tgt_lang=tgt, dev=corpus(data, "val", src, tgt, False),
                          test=corpus(data, "test_2016_flickr", src, tgt, False),
                          train=corpus(data, "train", src, tgt, False) if single else
                          [corpus(data, "train", s, t) for s, t in pairs])
    if single:
        config["tokenizer"]["vocab_size"] = 8000  # the single-pair recipe's
    config["train"].update(max_minutes=minutes, max_epochs=1_000_000, max_steps=0,
                           run_dir=str(root / name))
    config = smoke_config(config) if smoke else config
    path = root / f"{name}.json"
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def score(run: Path, data: Path, src: str, tgt: str) -> dict:
    found = eval_scores(run, data / f"test_2016_flickr.{src}.gz", data / f"test_2016_flickr.{tgt}.gz",
                        "--tgt-lang", tgt)
    return {metric: record["score"] for metric, record in found.items()}


def steps_of(run: Path) -> int:
    from attnmt.models.checkpoint import read_pointer
    from attnmt.runfiles import RunDir

    return int(read_pointer(RunDir(run), "latest")["file"].removeprefix("step_").removesuffix(".pt"))


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("--data", type=InputFolder(), required=True,
                        help="The Multi30k folder (train.de.gz, ...).")
    parser.add_argument("--pairs", type=Pattern(r"[A-Za-z][A-Za-z0-9_]*-[A-Za-z][A-Za-z0-9_]*",
                                                "SRC-TGT, e.g. de-en"),
                        nargs="+", default=["de-en", "de-fr", "en-fr"])
    parser.add_argument("--minutes", type=Number(float, above=0), required=True,
                        help="Training minutes per pair.")
    parser.add_argument("--base", type=ConfigFile(), default=BASE)
    parser.add_argument("--run-root", type=OutputFolder(), default=REPO / "runs" / "bench_multilingual")
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    parser.add_argument("--smoke", action="store_true", help="CI's smoke run (its numbers mean nothing): the "
                        "base's smallest model and a 100-piece vocabulary, a few steps instead of --minutes, "
                        "attnmt's commands in this process")
    parser.checks.append(check_data)
    return parser


def check_data(args) -> None:
    """Every pair's training, dev and test files are in --data."""
    names = {f"{split}.{lang}.gz" for pair in args.pairs for lang in pair.split("-")
             for split in ("train", "val", "test_2016_flickr")}
    missing = sorted(name for name in names if not (args.data / name).is_file())
    if missing:
        raise DataError(f"--data {args.data}: no {', '.join(missing)} in it")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    in_process(args.smoke)
    pairs = [tuple(p.split("-")) for p in args.pairs]
    root, data = args.run_root.resolve(), args.data.resolve()
    root.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.base.read_text(encoding="utf-8"))
    multi = write_config(base, root, "multilingual", pairs, data, args.minutes * len(pairs), args.smoke)
    attnmt("train", multi)
    rows = []
    for src, tgt in pairs:
        name = f"{src}-{tgt}"
        single = write_config(base, root, name, [(src, tgt)], data, args.minutes, args.smoke)
        attnmt("train", single)
        rows.append({"pair": name, "single": score(root / name, data, src, tgt),
                     "multilingual": score(root / "multilingual", data, src, tgt),
                     "single_steps": steps_of(root / name)})
        print(rows[-1], flush=True)
    total = args.minutes * len(pairs)
    print(f"\n{args.minutes:g} minutes per pair; the multilingual model {total:g} minutes, "
          f"{steps_of(root / 'multilingual')} steps")
    print("\n| pair | single-pair BLEU | multilingual BLEU | difference | single chrF | multilingual chrF |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        s, m = row["single"], row["multilingual"]
        print(f"| {row['pair']} | {s['bleu']:.2f} | {m['bleu']:.2f} | {m['bleu'] - s['bleu']:+.2f} | "
              f"{s['chrf']:.2f} | {m['chrf']:.2f} |")
    save_rows(rows, args.json)


if __name__ == "__main__":
    run_main(main)
