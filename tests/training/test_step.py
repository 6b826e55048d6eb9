"""step.py: one optimizer step against its definitions: the loss over the step's target tokens makes the
cut into micro-batches irrelevant, a non-finite step changes nothing, and a stop or the clock is asked
after the backward pass."""

from __future__ import annotations

import copy

import torch

from attnmt.config.schema import TrainConfig, TransformerConfig
from attnmt.data.batching import EncodedSplit
from attnmt.models import build_model
from attnmt.training.distributed import Dist
from attnmt.training.faults import NO_FAULTS, Faults
from attnmt.training.optim import Schedule, make_optimizer
from attnmt.training.step import OptimizerStep, step_seed

CFG = TrainConfig(lr=1e-2, warmup_steps=0, clip_norm=0.0, label_smoothing=0.1)


def data() -> EncodedSplit:
    generator = torch.Generator().manual_seed(0)
    src = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (3, 7, 5, 4)]
    tgt = [torch.randint(4, 30, (n,), generator=generator).tolist() for n in (6, 2, 5, 8)]
    return EncodedSplit.from_lists(src, tgt, ["" for _ in src])


def stepper(faults=NO_FAULTS, sgd: bool = False) -> OptimizerStep:
    """A tiny float64 Transformer's step; with ``sgd``, plain SGD, whose update is the gradient itself (Adam
    would blow up float noise on gradients that are zero in exact arithmetic, as a key bias's are)."""
    torch.manual_seed(0)
    cfg = TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32,
                            dropout=0.0)
    model = build_model(cfg, 30, 30).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=CFG.lr) if sgd else make_optimizer(model, CFG)
    return OptimizerStep(model, model, model, optimizer, Schedule.from_config(CFG, 10), None, None, Dist(),
                         torch.device("cpu"), CFG, data(), faults)


def never() -> bool:
    return False


def test_micro_batches_of_a_step_add_up_to_the_whole_batch():
    """Each micro-batch's summed loss is divided by the step's target tokens, so two micro-batches give the
    gradient, the update and the logged sums of one batch of the same sentences."""
    split, whole = stepper(sgd=True), stepper(sgd=True)
    a = split([[0, 1], [2, 3]], 1, never, never)
    b = whole([[0, 1, 2, 3]], 1, never, never)
    assert not a.skipped and not b.skipped
    assert a.tgt_tokens == b.tgt_tokens == sum(len(t) + 1 for t in data().tgt_ids)
    assert abs(a.loss - b.loss) < 1e-9 and abs(a.nll - b.nll) < 1e-9
    assert abs(a.grad_norm - b.grad_norm) < 1e-9
    for (name, p), q in zip(split.model.named_parameters(), whole.model.parameters()):
        torch.testing.assert_close(p, q, atol=1e-12, rtol=0, msg=name)
    untouched = stepper(sgd=True).model  # and the step did move the weights
    assert any(not torch.equal(p, q) for p, q in zip(untouched.parameters(), split.model.parameters()))


def test_a_non_finite_step_changes_nothing():
    step = stepper(Faults(nan_at_step=1))
    before = copy.deepcopy(step.model.state_dict())
    result = step([[0, 1, 2, 3]], 1, never, never)
    assert result.skipped and result.loss == 0 and result.lr is None
    for name, tensor in step.model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert not step.optimizer.state  # Adam took no step: no moments, no step count
    assert all(p.grad is None for p in step.model.parameters())
    assert not step([[0, 1, 2, 3]], 2, never, never).skipped  # the next step is fine


def test_stop_and_clock_are_asked_after_the_backward_pass():
    step = stepper()
    seen = []

    def asked() -> bool:
        seen.append(all(p.grad is not None for p in step.model.parameters() if p.requires_grad))
        return True

    result = step([[0, 1], [2, 3]], 1, asked, asked)
    assert seen == [True, True] and result.stop_requested and result.time_up


def test_step_seeds_are_a_function_of_seed_step_and_position():
    assert step_seed(1, 5, 0) == step_seed(1, 5, 0)
    seeds = {step_seed(seed, step, position) for seed in (1, 2) for step in (1, 2) for position in (0, 1)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
