"""Training throughput of the Multi30k recipes, side by side with JoeyNMT 2.3.0 in one run.

    python scripts/bench_train.py                       # attnmt Transformer and LSTM, 40 timed steps each
    python scripts/bench_train.py --joey 240            # ... and JoeyNMT for 240 s each
                                                        # (needs ../shared/peers/setup.sh)
    python scripts/bench_train.py --device cuda --archs transformer --steps 300   # on a GPU: bf16 autocast

For each recipe, in a fresh child process: prepare the data (not timed), run 5 warm-up steps, then time
``--steps`` optimizer steps and report source + target non-pad tokens per second, target tokens per
second, peak resident memory, and model FLOP utilisation: the FLOPs of one measured training step
(``torch.utils.flop_counter.FlopCounterMode``, forward + backward) times steps per second, over the
fp32 matmul peak of this machine measured in the same run (``torch.mm`` on 2048 x 2048, as the peers'
``matmul_peak.py`` does). JoeyNMT runs the peers' configs (same dims, batch 4096
tokens) under ``../shared/peers/run_joey.sh`` and its logged target tokens/s is compared with ours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO.parent / "shared" / "peers"
RECIPES = {"transformer": "configs/multi30k_de_en_transformer.yaml",
           "lstm": "configs/multi30k_de_en_lstm.yaml"}
JOEY_NAMES = {"transformer": "transformer", "lstm": "rnn"}


def matmul_peak(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b, c = torch.randn(2048, 2048), torch.randn(2048, 2048), torch.empty(2048, 2048)
    for _ in range(3):
        torch.mm(a, b, out=c)
    times = []
    for _ in range(10):
        t = time.perf_counter()
        torch.mm(a, b, out=c)
        times.append(time.perf_counter() - t)
    return 2 * 2048**3 / statistics.median(times) / 1e9


def child(arch: str, steps: int, threads: int, data: str | None, device: str, precision: str) -> dict:
    """One recipe in this process: returns its measurements."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from attnmt.config import load_config
    from attnmt.runfiles import RunDir
    from attnmt.runlog import quiet
    from attnmt.train import Trainer

    torch.set_num_threads(threads)
    overrides = [f"train.device={device}", f"train.precision={precision}"]
    if data:
        for split, name in (("train", "train"), ("dev", "val"), ("test", "test_2016_flickr")):
            overrides += [f"data.{split}.src={data}/{name}.de.gz", f"data.{split}.tgt={data}/{name}.en.gz"]
    cfg = load_config(REPO / RECIPES[arch], overrides)
    with tempfile.TemporaryDirectory() as tmp:
        cfg.train.run_dir = Path(tmp)
        trainer = Trainer(cfg, RunDir(Path(tmp)), quiet)
        trainer.setup(resume=False)
        batches = trainer.sampler.batches(0)
        accum = cfg.train.accum_steps
        groups = [batches[i : i + accum] for i in range(0, len(batches), accum)]
        for group in groups[:5]:
            trainer.train_step(group)
        with FlopCounterMode(display=False) as counter:
            trainer.train_step(groups[5])
        flops_per_token = counter.get_total_flops() / sum(
            trainer.train_data.batch(i).n_tgt_tokens + trainer.train_data.batch(i).n_src_tokens
            for i in groups[5]
        )
        measured = groups[6 : 6 + steps]
        start = time.perf_counter()
        tokens = tgt_tokens = 0
        for group in measured:
            result = trainer.train_step(group)
            tokens += result.tokens
            tgt_tokens += result.tgt_tokens
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {
        "device": device,
        "precision": precision if device == "cuda" else "fp32",
        "peak_gpu_mib": torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None,
        "arch": arch,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "steps": len(measured),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "tgt_tokens_per_s": tgt_tokens / seconds,
        "flops_per_token": flops_per_token,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def run_joey(arch: str, budget: int) -> dict | None:
    anchors = Path(os.environ.get("ANCHORS_DIR", Path.home() / ".cache" / "attnmt-anchors"))
    if not (anchors / "venv" / "bin" / "python").exists():
        print(f"JoeyNMT: no venv at {anchors}/venv; run bash {PEERS}/setup.sh and prepare_data.sh first",
              file=sys.stderr)
        return None
    env = {**os.environ, "VALIDATION_FREQ": "100000", "LOGGING_FREQ": "10", "TAG": "_bench"}
    out = subprocess.run(["bash", str(PEERS / "run_joey.sh"), JOEY_NAMES[arch], str(budget)],
                         env=env, capture_output=True, text=True)
    match = re.search(r'"target_tokens_per_s_median":\s*([\d.]+)', out.stdout)
    if not match:
        print(f"JoeyNMT {arch}: no throughput in its log:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}",
              file=sys.stderr)
        return None
    return {"arch": arch, "tgt_tokens_per_s": float(match.group(1))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--archs", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    ap.add_argument("--data", help="folder with Multi30k {train,val,test_2016_flickr}.{de,en}.gz "
                                   "(default: the recipes' paths)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"],
                    help="autocast dtype on CUDA")
    ap.add_argument("--joey", type=int, default=0, metavar="SECONDS",
                    help="also run JoeyNMT for this many seconds per arch")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.steps, args.threads, args.data, args.device,
                                           args.precision)))
        return

    peak = matmul_peak(args.threads) if args.device == "cpu" else float("nan")
    print(f"fp32 matmul peak (torch.mm 2048, {args.threads} threads): {peak:.1f} GFLOP/s"
          if args.device == "cpu"
          else "on CUDA: MFU is not computed (no measured peak); see peak GPU memory instead")
    rows = []
    for arch in args.archs:
        cmd = [sys.executable, __file__, "--child", arch, "--steps", str(args.steps),
               "--threads", str(args.threads), "--device", args.device, "--precision", args.precision]
        if args.data:
            cmd += ["--data", args.data]
        out = subprocess.run(cmd, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{arch} failed:\n{out.stderr[-3000:]}")
        result = json.loads(line[7:])
        result["mfu"] = result["flops_per_token"] * result["tokens_per_s"] / (peak * 1e9)
        result["joey"] = run_joey(arch, args.joey) if args.joey else None
        rows.append(result)

    print(f"\n{'recipe':<12}{'params':>11}{'tok/s (src+tgt)':>17}{'tgt tok/s':>11}{'peak MiB':>10}{'MFU':>7}"
          f"{'JoeyNMT tgt tok/s':>19}{'ratio':>7}")
    for r in rows:
        joey = r["joey"]["tgt_tokens_per_s"] if r["joey"] else None
        joey_text = f"{joey:,.0f}" if joey else "-"
        ratio_text = f"{r['tgt_tokens_per_s'] / joey:.2f}x" if joey else "-"
        print(f"{r['arch']:<12}{r['parameters']:>11,}{r['tokens_per_s']:>17,.0f}{r['tgt_tokens_per_s']:>11,.0f}"
              f"{r['peak_rss_mib']:>10,.0f}{r['mfu']:>7.1%}{joey_text:>19}{ratio_text:>7}")
    print("\n" + json.dumps(rows))


if __name__ == "__main__":
    main()
