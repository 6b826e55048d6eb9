#!/usr/bin/env bash
# The prepared GPU check of issue 16: one short script for a lent CUDA machine (the workplace's `device`
# tool), a few minutes end to end, everything written to one report.
#
#   here, once:   bash scripts/gpu_check.sh --stage
#                 copies Multi30k (../shared/data/multi30k) and the CPU run's metrics into .gpu/ (ignored
#                 by git), and downloads the wheels the GPU image lacks (pydantic and its needs) into
#                 .gpu/whl; CPU_RUN=RUN picks the CPU run whose loss curve is compared (default below)
#   there:        bash scripts/gpu_check.sh            (device tool: carry [".gpu"], timeout_s 600)
#                 writes $OUT/gpu_report.txt (or ./gpu_report.txt without $OUT) and $OUT/metrics.jsonl
#
# What it reports, in order:
#   1. the GPU, driver, torch and CUDA versions;
#   2. which SDPA kernels run for the shapes and masks attnmt gives (no mask, causal, padding mask), each
#      backend tried alone, and the kernels the default dispatch picked (from the profiler);
#   3. scripts/bench/bench_train.py on CUDA: bf16 eager and bf16 + torch.compile, tokens/s and peak GPU memory;
#   4. a bf16 + compile training run of the Multi30k Transformer for GPU_STEPS steps, its loss at every
#      logged step beside the CPU run's loss at the same step (same recipe, same batches: the curves should
#      agree in shape, within bf16 and kernel noise);
#   5. beam-5 decoding of test_2016_flickr with that run: BLEU (sacrebleu, 13a) and the seconds it took.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=.gpu
CPU_RUN=${CPU_RUN:-/work/runs_bench/r25_bf16}
GPU_STEPS=${GPU_STEPS:-600}

if [[ "${1:-}" == "--stage" ]]; then
    mkdir -p "$STAGE/data" "$STAGE/whl"
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    for split in train val test_2016_flickr; do
        for lang in de en; do cp "../shared/data/multi30k/$split.$lang.gz" "$STAGE/data/"; done
    done
    if [[ -f "$CPU_RUN/metrics.jsonl" ]]; then cp "$CPU_RUN/metrics.jsonl" "$STAGE/cpu_metrics.jsonl"; fi
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$STAGE/whl" \
        pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
        || { echo "pip download failed" >&2; exit 1; }
    du -sh "$STAGE"
    exit 0
fi

OUT=${OUT:-.}
REPORT="$OUT/gpu_report.txt"
: > "$REPORT"
say() { echo "$@" | tee -a "$REPORT"; }
section() { say; say "== $*"; }
export PYTHONUNBUFFERED=1
if compgen -G "$STAGE/whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "$STAGE"/whl/*.whl || { say "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
DATA="$STAGE/data"

section "1. machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$REPORT"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" \
    2>&1 | tee -a "$REPORT"

section "2. SDPA kernels for attnmt's shapes (B 128, H 4, T 28, d 64, bf16)"
python3 - <<'EOF' 2>&1 | tee -a "$REPORT"
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from attnmt.models.kernels import sdpa_attention
from attnmt.data.batching import padding_mask
from attnmt.models.masks import causal_mask, cross_mask

B, H, T, d = 128, 4, 28, 64
q, k, v = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
lengths = torch.randint(5, T + 1, (B,), device="cuda")
cases = {"no mask": (None, False), "causal": (None, True),
         "padding mask": (cross_mask(padding_mask(lengths, T)), False)}
for name, (mask, causal) in cases.items():
    ran = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).sum().backward()
            ran.append(backend.name)
        except RuntimeError:
            pass
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        sdpa_attention(q, k, v, mask, causal)[0].sum().backward()
        torch.cuda.synchronize()
    picked = sorted({e.key for e in prof.key_averages()
                     if any(w in e.key.lower() for w in ("flash", "efficient", "fmha", "cudnn", "attention"))})
    print(f"{name:>13}: backends that run alone: {', '.join(ran)}")
    print(f"{'':>13}  attnmt's sdpa_attention dispatched to: {'; '.join(p[:90] for p in picked) or '(none named)'}")
EOF

section "3. bench_train.py on CUDA (bf16; compile off and on)"
python3 scripts/bench/bench_train.py --device cuda --archs transformer lstm --precision bf16 --compile off on \
    --steps 300 --data "$DATA" 2>&1 | grep -v '^\[' | tee -a "$REPORT"

section "4. bf16 + compile training run, $GPU_STEPS steps, against the CPU run's curve"
RUN=/tmp/gpu_run
rm -rf "$RUN"
SETS=(--set "data.train.src=$DATA/train.de.gz" --set "data.train.tgt=$DATA/train.en.gz"
      --set "data.dev.src=$DATA/val.de.gz" --set "data.dev.tgt=$DATA/val.en.gz"
      --set "data.test.src=$DATA/test_2016_flickr.de.gz" --set "data.test.tgt=$DATA/test_2016_flickr.en.gz")
start=$(date +%s)
python3 -m attnmt train configs/multi30k_de_en_transformer.yaml --run-dir "$RUN" "${SETS[@]}" \
    --set train.device=cuda --set train.precision=bf16 --set train.compile=true \
    --set train.max_minutes=0 --set "train.max_steps=$GPU_STEPS" --set train.eval_every=300 \
    --set train.save_every=300 > "$OUT/train_log.txt" 2>&1
say "exit $? after $(( $(date +%s) - start )) s (preparation and compilation included)"
cp "$RUN/metrics.jsonl" "$OUT/metrics.jsonl" 2>/dev/null
python3 - "$RUN/metrics.jsonl" "$STAGE/cpu_metrics.jsonl" <<'EOF' 2>&1 | tee -a "$REPORT"
import json, sys
from pathlib import Path

def records(path):
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []

gpu, cpu = records(sys.argv[1]), records(sys.argv[2])
cpu_loss = {r["step"]: r["loss"] for r in cpu if r["event"] == "train"}
print(f"{'step':>6}{'GPU loss':>10}{'CPU loss':>10}{'GPU tok/s':>12}")
for r in (r for r in gpu if r["event"] == "train"):
    other = cpu_loss.get(r["step"])
    print(f"{r['step']:>6}{r['loss']:>10.3f}{other if other is None else format(other, '10.3f'):>10}"
          f"{r['tokens_per_s']:>12,.0f}")
for r in (r for r in gpu if r["event"] == "valid"):
    print(f"dev at step {r['step']}: BLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f}")
EOF

section "5. beam-5 decoding of test_2016_flickr"
start=$(date +%s.%N)
python3 -m attnmt eval "$RUN" --src "$DATA/test_2016_flickr.de.gz" --ref "$DATA/test_2016_flickr.en.gz" \
    --device cuda --beam-size 5 2>&1 | tee -a "$REPORT"
say "decoding and scoring: $(python3 -c "print(round($(date +%s.%N) - $start, 1))") s"
