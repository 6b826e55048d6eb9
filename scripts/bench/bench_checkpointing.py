"""Peak memory and time of one training step with and without ``train.gradient_checkpointing``.

    python scripts/bench/bench_checkpointing.py                      # depths 6 and 12, lengths 64 and 256
    python scripts/bench/bench_checkpointing.py --depth 12 --length 256 --batch 32

Each case runs in a fresh child process: a Transformer of the Multi30k recipe's width (d_model 256, 4
heads, d_ff 1024, dropout 0.1) with ``--depth`` encoder and decoder layers, a batch of ``--batch`` random
sentences of ``--length`` pieces on both sides; one warm-up step on a small batch, then one timed forward
and backward pass on the full one. Memory is the peak resident set (``ru_maxrss``) of that pass minus the
resident set before it, so the weights, the allocator's pools and the warm-up are not counted: what is
left is what the pass kept for its backward. The gradients of the two runs are compared (same seed, same
dropout masks): the report gives their largest difference.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: scriptargs and the tools

from benchlib import REPO
from scriptargs import Number, ScriptParser, guarded


def rss_mib() -> float:
    """The current resident set, from /proc (ru_maxrss is only the peak)."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def child(depth: int, length: int, batch: int, threads: int, on: bool) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    from attnmt.config.schema import TransformerConfig
    from attnmt.data.batching import collate
    from attnmt.models import build_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = TransformerConfig(arch="transformer", d_model=256, n_heads=4, enc_layers=depth, dec_layers=depth,
                            d_ff=1024, dropout=0.1, share_embeddings=True, tie_output=True)
    model = build_model(cfg, 8000, 8000)
    model.gradient_checkpointing = on
    generator = torch.Generator().manual_seed(1)
    sentences = [torch.randint(4, 8000, (length,), generator=generator).tolist() for _ in range(batch)]
    small, full = collate(sentences[:2], sentences[:2]), collate(sentences, sentences)
    model(small).logits.sum().backward()  # warm-up: the allocator and the kernels' first calls
    model.zero_grad(set_to_none=True)
    before = rss_mib()
    torch.manual_seed(2)
    start = time.perf_counter()
    logits = model(full).logits
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), full.tgt_out.flatten()).backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.save(grads, f"/tmp/bench_checkpointing_{depth}_{length}_{int(on)}.pt")
    return {"depth": depth, "length": length, "batch": batch, "checkpointing": on,
            "pass_mib": peak - before, "seconds": seconds}


def build_parser() -> ScriptParser:
    ap = ScriptParser(description=__doc__)
    ap.add_argument("--depth", type=Number(int, low=1), nargs="+", default=[6, 12])
    ap.add_argument("--length", type=Number(int, low=1), nargs="+", default=[64, 256])
    ap.add_argument("--batch", type=Number(int, low=2), default=32)
    ap.add_argument("--threads", type=Number(int, low=1), default=2)
    ap.add_argument("--child", nargs=2, type=Number(int, low=1), help=argparse.SUPPRESS)
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    return ap


@guarded
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child[0], args.child[1], args.batch, args.threads, args.on)))
        return
    import torch

    print(f"{'depth':>6}{'length':>8}{'batch':>7}{'plain MiB':>11}{'ckpt MiB':>10}{'saved':>8}"
          f"{'plain s':>9}{'ckpt s':>8}{'time':>7}{'max |grad diff|':>17}")
    for depth in args.depth:
        for length in args.length:
            rows = {}
            for on in (False, True):
                cmd = [sys.executable, __file__, "--child", str(depth), str(length),
                       "--batch", str(args.batch), "--threads", str(args.threads)] + (["--on"] if on else [])
                out = subprocess.run(cmd, capture_output=True, text=True)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    sys.exit(f"depth {depth} length {length} failed:\n{out.stderr[-3000:]}")
                rows[on] = json.loads(line[7:])
            diff = float((torch.load(f"/tmp/bench_checkpointing_{depth}_{length}_1.pt")
                          - torch.load(f"/tmp/bench_checkpointing_{depth}_{length}_0.pt")).abs().max())
            plain, ckpt = rows[False], rows[True]
            # a pass too small to raise the peak past the warm-up's (the smoke sizes) saves nothing to say
            saved = f"{1 - ckpt['pass_mib'] / plain['pass_mib']:.0%}" if plain["pass_mib"] > 0 else "-"
            print(f"{depth:>6}{length:>8}{args.batch:>7}{plain['pass_mib']:>11,.0f}{ckpt['pass_mib']:>10,.0f}"
                  f"{saved:>8}{plain['seconds']:>9.2f}{ckpt['seconds']:>8.2f}"
                  f"{ckpt['seconds'] / plain['seconds']:>6.2f}x{diff:>17.2e}")


if __name__ == "__main__":
    main()
