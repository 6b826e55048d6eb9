"""Tagged back-translation (Caswell et al. 2019) on Multi30k, German to English, at equal minutes.

    python scripts/bench/bench_backtranslation.py --data ../shared/data/multi30k --minutes 5 \\
        --run-root ../runs/bench_backtranslation

The training captions are cut in two halves: the first is the parallel data, the second's English side plays
the monolingual text (its German side is never read). The recipe: train English to German on the parallel
half; translate the monolingual English into German with ``translate --sampling`` (samples, not the beam's
best, as Edunov et al. 2018 advise); then train German to English twice for the same minutes, on the parallel
half alone and with the back-translations added as a second corpus tagged ``<bt>`` (``data.train: [{...},
{..., tag: <bt>, weight: W}]``), and score both on the test set. ``--smoke`` is CI's smoke run
(``tests/scripts/test_scripts_smoke.py``), its numbers meaningless: the recipe's smallest model and a
100-piece vocabulary (``benchlib.smoke_config``), each training a few steps instead of ``--minutes``, and
attnmt's commands run in this process instead of a child each (``benchlib.in_process``).
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO, attnmt, eval_scores, in_process, run_main, save_rows, smoke_config
from scriptargs import InputFolder, Number, OutputFile, OutputFolder, ScriptParser, guarded

from attnmt.errors import DataError

BASE = REPO / "configs" / "multi30k_de_en_transformer.yaml"
MULTI30K = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]


def halves(data: Path, root: Path) -> dict[str, Path]:
    """The parallel half (de, en) and the monolingual half's English, as files under ``root``."""
    out = {name: root / f"{name}.txt" for name in ("parallel.de", "parallel.en", "mono.en")}
    if all(p.exists() for p in out.values()):
        return out
    sides = {lang: gzip.open(data / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
             for lang in ("de", "en")}
    half = len(sides["en"]) // 2
    out["parallel.de"].write_text("\n".join(sides["de"][:half]) + "\n", encoding="utf-8")
    out["parallel.en"].write_text("\n".join(sides["en"][:half]) + "\n", encoding="utf-8")
    out["mono.en"].write_text("\n".join(sides["en"][half:]) + "\n", encoding="utf-8")
    return out


def write_config(base: dict, root: Path, name: str, train, src: str, tgt: str, data: Path,
                 minutes: float, smoke: bool = False) -> Path:
    """The base recipe on these corpora, trained ``minutes`` (``smoke``: a few steps of its smallest model,
    ``benchlib.smoke_config``)."""
    config = json.loads(json.dumps(base))
    test = {"src": str(data / f"test_2016_flickr.{src}.gz"), "tgt": str(data / f"test_2016_flickr.{tgt}.gz")}
    config["data"].update(src_lang=src, tgt_lang=tgt, train=train, test=test,
                          dev={"src": str(data / f"val.{src}.gz"), "tgt": str(data / f"val.{tgt}.gz")})
    config["train"].update(max_minutes=minutes, max_epochs=1_000_000, max_steps=0, run_dir=str(root / name))
    config = smoke_config(config) if smoke else config
    path = root / f"{name}.json"
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return path


def build_parser() -> ScriptParser:
    parser = ScriptParser(description=__doc__)
    parser.add_argument("--data", type=InputFolder(), required=True,
                        help="The Multi30k folder (train.de.gz, ...).")
    parser.add_argument("--minutes", type=Number(float, above=0), required=True,
                        help="Training minutes of each model.")
    parser.add_argument("--reverse-minutes", type=Number(float, above=0), default=None,
                        help="Training minutes of the English-German model that back-translates (default: "
                             "--minutes).")
    parser.add_argument("--top-k", type=Number(int, low=0), default=0, help="Sample the back-translations "
                        "from the K most probable pieces only (translate --top-k; default 0: all).")
    parser.add_argument("--weight", type=Number(float, above=0), default=1.0, help="The back-translations' "
                        "weight (the parallel corpus has 1).")
    parser.add_argument("--run-root", type=OutputFolder(), default=REPO / "runs" / "bench_backtranslation")
    parser.add_argument("--json", type=OutputFile(), help="Write the results here too.")
    parser.add_argument("--smoke", action="store_true", help="CI's smoke run (its numbers mean nothing): "
                        "the recipe's smallest model and a 100-piece vocabulary, a few steps instead of "
                        "--minutes, attnmt's commands in this process")
    parser.checks.append(check_data)
    return parser


def check_data(args) -> None:
    """The Multi30k files the recipe reads are in --data."""
    missing = [name for name in MULTI30K if not (args.data / name).is_file()]
    if missing:
        raise DataError(f"--data {args.data}: no {', '.join(missing)} in it")


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    in_process(args.smoke)
    root, data = args.run_root.resolve(), args.data.resolve()
    root.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(BASE.read_text(encoding="utf-8"))
    files = halves(data, root)
    parallel = {"src": str(files["parallel.de"]), "tgt": str(files["parallel.en"])}
    reverse = {"src": str(files["parallel.en"]), "tgt": str(files["parallel.de"])}
    reverse_minutes = args.reverse_minutes or args.minutes
    attnmt("train", write_config(base, root, "en-de", reverse, "en", "de", data, reverse_minutes, args.smoke))
    bt = root / "mono.bt.de"
    if not bt.exists():
        attnmt("translate", root / "en-de", "-i", files["mono.en"], "-o", bt, "--sampling", "--seed", "1",
               "--top-k", args.top_k)
    tagged = {"src": str(bt), "tgt": str(files["mono.en"]), "tag": "<bt>", "weight": args.weight}
    both = [{**parallel, "weight": 1.0}, tagged]
    runs = {"parallel only": write_config(base, root, "de-en", parallel, "de", "en", data, args.minutes,
                                          args.smoke),
            "+ tagged back-translation": write_config(base, root, "de-en-bt", both, "de", "en", data,
                                                      args.minutes, args.smoke)}
    rows = []
    for name, config in runs.items():
        attnmt("train", config)
        run = Path(json.loads(config.read_text(encoding="utf-8"))["train"]["run_dir"])
        found = eval_scores(run, data / "test_2016_flickr.de.gz", data / "test_2016_flickr.en.gz")
        scores = {metric: record["score"] for metric, record in found.items()}
        rows.append({"run": name, **scores})
        print(rows[-1], flush=True)
    print(f"\nGerman to English, {args.minutes:g} minutes each; back-translation weight {args.weight:g}")
    print("\n| training data | BLEU | chrF |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['run']} | {row['bleu']:.2f} | {row['chrf']:.2f} |")
    save_rows(rows, args.json)


if __name__ == "__main__":
    run_main(main)
