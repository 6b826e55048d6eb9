"""Decoding speed: attnmt's search on trained models, and side by side with Hugging Face and CTranslate2.

    python scripts/bench_decode.py --models runs/multi30k_de_en_transformer runs/multi30k_de_en_lstm
    python scripts/bench_decode.py --equal-work --peers      # + HF generate and CTranslate2 in one run
    python scripts/bench_decode.py --parts                   # the decoder's pieces, old against new
    python scripts/bench_decode.py --equal-work --against 14964ad   # this tree against a commit, alternating

Part 1 (``--models``): sentences/s and generated tokens/s of greedy and beam-5 search on the 1,000
test_2016_flickr sentences, batches of 64 in file order, with each trained model.

Part 2 (``--equal-work``): equal work for every engine, as ``../shared/peers/decode_speed.py`` measures
the peers: random weights, 3+3 layers, d_model 256, 4 heads, ff 1024, vocabulary 8,000, tied
embeddings, the same 1,000 sentences in the same batches of 64, and every output forced to exactly 30
new tokens (attnmt: ``min_len = 30`` and the limit ``max_len_a = 0, max_len_b = 30``; attnmt's search
then takes one more step to score the forced EOS, which the peers' forced lengths do not, so attnmt
does 31/30 of their work). ``--peers`` runs that script in the peers' virtual environment
(``bash ../shared/peers/setup.sh``) in the same invocation, in rounds that alternate with attnmt: each
round is one timed pass of every engine, and ratios are the median of the per-round ratios.

Part 3 (``--equal-work --against REV``): the equal-work pass of this tree and of commit REV (checked out
into a temporary git worktree, whose own ``scripts/bench_decode.py`` runs there) in alternating rounds,
each a fresh process, the two taking turns to go first; ratios are the median of the per-round ratios,
as for the peers.

Each configuration: one warm-up batch, then the median of ``--runs`` full passes. ``--threads`` (2)
torch threads everywhere.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TEST_DE = SHARED / "data" / "multi30k" / "test_2016_flickr.de.gz"


def read_sources(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


def time_search(model, id_batches, beam: int, runs: int, **limits) -> dict:
    """Median seconds of a full pass over ``id_batches`` (file-order batches), after one warm-up batch."""
    import torch

    from attnmt.batching import collate
    from attnmt.decode import beam_search, greedy_search

    def one_pass(batches) -> int:
        generated = 0
        for ids in batches:
            batch = collate(ids)
            if beam == 1:
                hyps = [[h] for h in greedy_search(model, batch.src, batch.src_mask, **limits)]
            else:
                hyps = beam_search(model, batch.src, batch.src_mask, beam_size=beam, nbest=1,
                                   length_penalty=1.0, **limits)
            generated += sum(len(h[0].tokens) for h in hyps)
        return generated

    with torch.inference_mode():
        one_pass(id_batches[:1])
        times, generated = [], 0
        for _ in range(runs):
            start = time.perf_counter()
            generated = one_pass(id_batches)
            times.append(time.perf_counter() - start)
    n = sum(len(b) for b in id_batches)
    median = statistics.median(times)
    return {"beam": beam, "median_s": round(median, 3), "runs_s": [round(t, 3) for t in times],
            "sents_per_s": round(n / median, 1), "gen_tokens_per_s": round(generated / median, 1),
            "gen_tokens": generated}


def trained(paths: list[Path], runs: int, batch_size: int) -> list[dict]:
    from attnmt import fastpath
    from attnmt.checkpoint import load_model
    from attnmt.data import clean

    rows = []
    lines = read_sources(TEST_DE)
    for path in paths:
        model, tokenizer, cfg, ckpt = load_model(path)
        fastpath.apply(model)  # as the decoding commands do
        ids = tokenizer.encode_src([clean(x) for x in lines])
        batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
        d = cfg.decode
        for beam in (1, 5):
            result = time_search(model, batches, beam, runs, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
            rows.append({"engine": f"attnmt {cfg.model.arch} ({ckpt.name})", **result})
            print("RESULT " + json.dumps(rows[-1]), flush=True)
    return rows


def equal_work(runs: int, batch_size: int, length: int) -> list[dict]:
    import torch

    from attnmt import fastpath
    from attnmt.config import TransformerConfig
    from attnmt.data import clean
    from attnmt.models import build_model
    from attnmt.tokenizer import load_tokenizer

    torch.manual_seed(0)
    cfg = TransformerConfig(arch="transformer", d_model=256, n_heads=4, enc_layers=3, dec_layers=3, d_ff=1024,
                            dropout=0.1, share_embeddings=True, tie_output=True)
    model = build_model(cfg, 8000, 8000).eval()
    fastpath.apply(model)  # as the decoding commands do
    tokenizer_dir = REPO / "runs" / "multi30k_de_en_transformer" / "tokenizer"
    lines = read_sources(TEST_DE)
    if tokenizer_dir.exists():
        ids = load_tokenizer(tokenizer_dir).encode_src([clean(x) for x in lines])
    else:  # any 8,000-piece segmentation of similar length does the same work
        sys.exit(f"no Multi30k tokenizer at {tokenizer_dir}: "
                 "run attnmt prepare configs/multi30k_de_en_transformer.yaml")
    batches = [ids[i : i + batch_size] for i in range(0, len(ids), batch_size)]
    rows = []
    for beam in (1, 5):
        result = time_search(model, batches, beam, runs, max_len_a=0.0, max_len_b=length, min_len=length)
        # exactly `length` tokens, EOS forced after
        assert result["gen_tokens"] == length * len(lines), result
        rows.append({"engine": "attnmt (random weights)", **result})
        print("RESULT " + json.dumps(rows[-1]), flush=True)
    return rows


def parts(reps: int) -> list[dict]:
    """The pieces the decoder chose against what they replace, side by side in this process, at the
    equal-work sizes (batch 64 x beam 5 = 320 rows, d_model 256, 4 heads, 16 cached positions, 20
    source pieces): median microseconds per call over ``reps`` rounds, alternating the two."""
    import torch
    import torch.nn.functional as F

    from attnmt.fastpath import PackedLinear
    from attnmt.kernels import math_attention, sdpa_attention

    def timed(fn, calls: int = 20) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6

    torch.manual_seed(0)
    N, B, H, dh, t, S = 320, 64, 4, 64, 16, 20
    cases = []
    for d_in, d_out in ((256, 256), (256, 1024), (1024, 256), (256, 8000)):
        layer = PackedLinear(d_in, d_out, bias=d_out != 8000)
        x = torch.randn(N, d_in)
        cases.append((f"linear {N}x{d_in} -> {d_out}", "F.linear (MKL)",
                      lambda x=x, m=layer: F.linear(x, m.weight, m.bias),
                      "fastpath.PackedLinear (oneDNN)", lambda x=x, m=layer: m(x)))
    q, k, v = torch.randn(N, H, 1, dh), torch.randn(N, H, t, dh), torch.randn(N, H, t, dh)
    cases.append((f"self-attention step {N}x{H}x1 over {t}", "sdpa", lambda: sdpa_attention(q, k, v),
                  "math (step kernel)", lambda: math_attention(q, k, v)))
    qc, kc, vc = torch.randn(B, H, 5, dh), torch.randn(B, H, S, dh), torch.randn(B, H, S, dh)
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
    mask[::2, ..., S // 2 :] = False
    cases.append((f"cross-attention step {B}x{H}x5 over {S}, padded", "sdpa",
                  lambda: sdpa_attention(qc, kc, vc, mask),
                  "math (step kernel)", lambda: math_attention(qc, kc, vc, mask)))
    rows = []
    with torch.inference_mode():
        for name, old_name, old, new_name, new in cases:
            olds, news = [], []
            for _ in range(reps):
                olds.append(timed(old))
                news.append(timed(new))
            row = {"part": name, "old": old_name, "old_us": round(statistics.median(olds)), "new": new_name,
                   "new_us": round(statistics.median(news))}
            row["speedup"] = round(row["old_us"] / row["new_us"], 2)
            rows.append(row)
            print("PART " + json.dumps(row), flush=True)
    return rows


def peers(runs: int, batch_size: int, length: int, threads: int) -> list[dict]:
    anchors = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "attnmt-anchors"))
    python = anchors / "venv" / "bin" / "python"
    if not python.exists():
        print(f"peers: no venv at {anchors}/venv (bash {SHARED}/peers/setup.sh)", file=sys.stderr)
        return []
    out = subprocess.run(
        [str(python), str(SHARED / "peers" / "decode_speed.py"), "--runs", str(runs),
         "--batch-size", str(batch_size), "--length", str(length), "--threads", str(threads)],
        capture_output=True, text=True,
    )
    rows = [json.loads(m.group(1)) for m in re.finditer(r"^RESULT (\{.*\})$", out.stdout, re.M)]
    if not rows:
        print(f"peers failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", file=sys.stderr)
    return rows


def interleaved(rounds: int, batch_size: int, length: int, threads: int) -> list[dict]:
    """attnmt and the peers in alternation: each round times one pass of every engine (attnmt here,
    then the peers' script with ``--runs 1``), so a slow spell on the shared machine falls on all of
    them. Per engine: the median over rounds; per pair: the median of the per-round ratios."""
    per_round: list[dict[tuple[str, int], dict]] = []
    for r in range(rounds):
        found = {(row["engine"], row["beam"]): row for row in equal_work(1, batch_size, length)}
        theirs = peers(1, batch_size, length, threads)
        if not theirs:
            sys.exit("peers failed: see above")
        found.update({(row["engine"], row["beam"]): row for row in theirs})
        per_round.append(found)
        print(f"round {r + 1}/{rounds}: "
              + ", ".join(f"{e} b{b} {row['sents_per_s']}" for (e, b), row in found.items()), flush=True)
    rows = []
    for key in per_round[0]:
        rates = [found[key]["sents_per_s"] for found in per_round]
        tokens = [found[key]["gen_tokens_per_s"] for found in per_round]
        median = statistics.median(rates)
        rows.append({"engine": key[0], "beam": key[1], "sents_per_s": median,
                     "gen_tokens_per_s": statistics.median(tokens),
                     "median_s": statistics.median(found[key]["median_s"] for found in per_round),
                     "rounds_sents_per_s": rates})
        print("RESULT " + json.dumps(rows[-1]), flush=True)
    ours = "attnmt (random weights)"
    for beam in (1, 5):
        for engine, b in per_round[0]:
            if b != beam or engine == ours:
                continue
            ratios = [found[(ours, beam)]["sents_per_s"] / found[(engine, beam)]["sents_per_s"]
                      for found in per_round]
            print(f"beam {beam}: attnmt / {engine} = {statistics.median(ratios):.2f}x "
                  f"(per round: {', '.join(f'{x:.2f}' for x in ratios)})")
    return rows


def against(rev: str, rounds: int, threads: int) -> list[dict]:
    """This tree's equal-work pass and REV's, alternating (see the module docstring, part 3)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="attnmt-against-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
                       check=True, capture_output=True)
        try:
            (tree / "runs").symlink_to(REPO / "runs")  # the Multi30k tokenizer both passes segment with
            (tree.parent / "shared").symlink_to(SHARED)  # and the test sentences, beside the tree as here
            trees = {"this tree": REPO, rev: tree}
            per_round: list[dict[tuple[str, int], float]] = []
            for r in range(rounds):
                found = {}
                # ABBA: neither always goes first
                order = list(trees.items()) if r % 2 == 0 else list(trees.items())[::-1]
                for name, root in order:
                    out = subprocess.run(
                        [sys.executable, str(root / "scripts" / "bench_decode.py"),
                         "--equal-work", "--runs", "1", "--threads", str(threads)],
                        cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True,
                    )  # fmt: skip
                    rows = [json.loads(m.group(1))
                            for m in re.finditer(r"^RESULT (\{.*\})$", out.stdout, re.M)]
                    if not rows:
                        sys.exit(f"{name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
                    found.update({(name, row["beam"]): row["sents_per_s"] for row in rows})
                per_round.append(found)
                print(f"round {r + 1}/{rounds}: "
                      + ", ".join(f"{n} b{b} {v}" for (n, b), v in found.items()), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                           capture_output=True)
    rows = []
    for beam in (1, 5):
        ratios = [found[("this tree", beam)] / found[(rev, beam)] for found in per_round]
        row = {"beam": beam,
               "this_tree_sents_per_s": statistics.median(f[("this tree", beam)] for f in per_round),
               "rev": rev, "rev_sents_per_s": statistics.median(f[(rev, beam)] for f in per_round),
               "ratio": round(statistics.median(ratios), 3), "rounds": [round(x, 3) for x in ratios]}
        rows.append(row)
        print("AGAINST " + json.dumps(row), flush=True)
        print(f"beam {beam}: this tree / {rev} = {row['ratio']:.3f}x "
              f"(per round: {', '.join(f'{x:.3f}' for x in ratios)})")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", type=Path, default=[])
    ap.add_argument("--equal-work", action="store_true")
    ap.add_argument("--peers", action="store_true",
                    help="with --equal-work: also HF generate and CTranslate2")
    ap.add_argument("--parts", action="store_true", help="the decoder's pieces against what they replace")
    ap.add_argument("--against", metavar="REV",
                    help="with --equal-work: this tree against commit REV, alternating rounds")
    ap.add_argument("--no-malloc-tuning", action="store_true", help="leave glibc's malloc at its defaults")
    ap.add_argument("--runs", type=int, default=3, help="passes per configuration (with --peers: rounds)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--length", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    from attnmt.runtime import keep_freed_memory

    torch.set_num_threads(args.threads)
    # As `attnmt translate` and `attnmt eval` do (attnmt/runtime.py); --no-malloc-tuning measures without.
    tuned = not args.no_malloc_tuning and keep_freed_memory()
    print(f"malloc tuning: {'on' if tuned else 'off'}", flush=True)
    if args.parts:
        print(f"\n{'part':<46}{'old':>32}{'us':>8}{'new':>32}{'us':>8}{'speedup':>9}")
        for r in parts(max(args.runs, 5)):
            print(f"{r['part']:<46}{r['old']:>32}{r['old_us']:>8}{r['new']:>32}{r['new_us']:>8}{r['speedup']:>8.2f}x")
    if args.equal_work and args.against:
        against(args.against, args.runs, args.threads)
        return
    rows = trained(args.models, args.runs, args.batch_size) if args.models else []
    if args.equal_work and not args.peers:
        rows += equal_work(args.runs, args.batch_size, args.length)
    if args.equal_work and args.peers:
        rows += interleaved(args.runs, args.batch_size, args.length, args.threads)
    if not rows:
        return
    print(f"\n{'engine':<44}{'beam':>5}{'sent/s':>9}{'tok/s':>10}{'median s':>10}")
    for r in rows:
        print(f"{r['engine']:<44}{r['beam']:>5}{r['sents_per_s']:>9.1f}{r['gen_tokens_per_s']:>10.1f}{r['median_s']:>10.2f}")


if __name__ == "__main__":
    main()
