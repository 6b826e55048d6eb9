"""Where a training step's time goes: ``bench_train.py --profile``.

The trainer's own step (``Trainer.train_step``, the recipe as shipped but for ``train.precision``) runs
``--steps`` times under ``torch.profiler`` after 5 warm-up steps, in a child process per precision. Each
ATen operator's self time (its own time, not its callees') is put in one category by its name (and, for the
products, by whether one of its shapes is the vocabulary: the output projection). What no operator accounts
for is Python: the profiled step's wall time minus the operators' time. Every share is of the profiled step,
and its milliseconds that share of the step without the profiler. Data is the time of ``gather`` (the
batch's tensors from the memory-mapped split) timed apart, and padding the share of the positions the step
computes (batch size x longest source, and the same for the target) that are padding.
"""

from __future__ import annotations

import time
from collections import defaultdict

PRODUCTS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}
CATEGORIES = {  # category: operator names, checked in this order after the output projection
    "linear products": PRODUCTS,
    "attention products": {"aten::bmm", "aten::baddbmm"},
    "attention softmax": {"aten::_softmax", "aten::_softmax_backward_data", "aten::softmax"},
    "fused attention kernel": {"aten::_scaled_dot_product_flash_attention_for_cpu",
                               "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                               "aten::scaled_dot_product_attention"},
    "loss (log-softmax, nll)": {"aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::log_softmax",
                                "aten::gather", "aten::nll_loss_forward", "aten::nll_loss_backward"},
    "layer norms": {"aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::layer_norm"},
    "dropout masks": {"aten::uniform_", "aten::rand", "aten::ge", "aten::bernoulli_", "aten::native_dropout",
                      "dropout masks"},  # the last: attnmt.models.dropout's numpy draws
    "casts (autocast)": {"aten::copy_", "aten::_to_copy", "aten::to", "aten::clone"},
    "embeddings": {"aten::embedding", "aten::embedding_dense_backward", "aten::embedding_backward",
                   "aten::index_select", "aten::index_add_", "aten::index_put_"},
}
OPTIMIZER_PREFIXES = ("aten::_foreach", "aten::_fused_adam", "aten::linalg_vector_norm", "aten::clamp",
                      "Optimizer.")


def category(name: str, shapes: list, vocab: int) -> str:
    if name in PRODUCTS and any(vocab in shape for shape in shapes if isinstance(shape, list)):
        return "output projection"
    for label, names in CATEGORIES.items():
        if name in names:
            return label
    if name.startswith(OPTIMIZER_PREFIXES):
        return "optimizer and clipping"
    if not name.startswith("aten::"):
        return "autograd and profiler records"
    return "other element-wise"


def profile_steps(trainer, groups: list, steps: int) -> dict:
    """Profile ``steps`` of ``groups`` (the first 5 warm the step up) on ``trainer``: ms per step by
    category, the step's wall time with and without the profiler, data time and the padding share."""
    from torch.profiler import ProfilerActivity, profile

    from attnmt.data.batching import gather

    for group in groups[:5]:
        trainer.train_step(group)
    plain = groups[5 : 5 + steps]
    start = time.perf_counter()
    for group in plain:
        trainer.train_step(group)
    wall = (time.perf_counter() - start) / len(plain) * 1000
    measured = groups[5 + steps : 5 + 2 * steps]
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for group in measured:
            trainer.train_step(group)
    profiled = (time.perf_counter() - start) / len(measured) * 1000
    vocab = trainer.tokenizer.tgt_vocab_size
    per_step: dict[str, float] = defaultdict(float)
    for event in prof.key_averages(group_by_input_shape=True):
        per_step[category(event.key, event.input_shapes, vocab)] += event.self_cpu_time_total / 1000 / steps
    per_step["Python, outside any operator"] = max(0.0, profiled - sum(per_step.values()))
    start = time.perf_counter()
    batches = [gather(trainer.train_data, i) for group in measured for i in group]
    data = (time.perf_counter() - start) / steps * 1000
    real = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)
    computed = sum(b.src.numel() + b.tgt_in.numel() for b in batches)
    return {"wall_ms": wall, "profiled_ms": profiled, "per_step_ms": dict(per_step), "data_ms": data,
            "padding": 1 - real / computed, "tokens_per_step": real / steps}


def report(results: dict[str, dict]) -> None:
    """A table: each category's share of the step in each precision, its ms scaled to the unprofiled
    wall time, then the rest (Python and the dispatcher), data and padding."""
    labels = sorted({label for r in results.values() for label in r["per_step_ms"]},
                    key=lambda label: -max(r["per_step_ms"].get(label, 0.0) / r["profiled_ms"]
                                           for r in results.values()))
    names = list(results)
    print("\n| part of the step | " + " | ".join(f"{n} ms | {n} share" for n in names) + " |")
    print("| --- |" + " --- | --- |" * len(names))
    for label in labels:
        cells = []
        for name in names:
            r = results[name]
            share = r["per_step_ms"].get(label, 0.0) / r["profiled_ms"]
            cells.append(f"{share * r['wall_ms']:.1f} | {share:.1%}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("| **the step (no profiler)** | " + " | ".join(
        f"**{results[n]['wall_ms']:.0f}** | 100%" for n in names) + " |")
    for name in names:
        r = results[name]
        print(f"{name}: {r['tokens_per_step']:,.0f} tokens a step, {r['wall_ms']:.0f} ms a step without the "
              f"profiler and {r['profiled_ms']:.0f} with it; gather (data) {r['data_ms']:.1f} ms a step; "
              f"padding {r['padding']:.1%} of the positions computed")
