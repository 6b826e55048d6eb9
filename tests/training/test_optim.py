"""optim.py: the learning-rate schedules against their formulas, and the plateau rule."""

import copy
import json
import math

import pytest
import torch

from attnmt.config.schema import TrainConfig
from attnmt.training.optim import Schedule, make_optimizer, set_lr


def test_warmup_is_linear_up_to_the_peak():
    schedule = Schedule("inverse_sqrt", 1e-3, 10, 100, 0.0)
    assert [schedule.lr(step) for step in range(1, 11)] == pytest.approx(
        [1e-4 * k for k in range(1, 11)], rel=1e-12
    )


def test_inverse_sqrt_after_warmup():
    schedule = Schedule("inverse_sqrt", 1e-3, 10, 100, 0.0)
    assert schedule.lr(40) == pytest.approx(1e-3 * math.sqrt(10 / 40), rel=1e-12)
    assert schedule.lr(1000) == pytest.approx(1e-4, rel=1e-12)


def test_cosine_reaches_min_lr_at_the_end():
    schedule = Schedule("cosine", 1e-3, 10, 110, 1e-5)
    rates = [schedule.lr(step) for step in range(10, 111)]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(1e-5, rel=1e-12)
    assert schedule.lr(60) == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5), rel=1e-12)  # half way: the mean
    assert all(a >= b for a, b in zip(rates, rates[1:]))
    assert schedule.lr(500) == pytest.approx(1e-5, rel=1e-12)


def test_plateau_halves_after_two_bad_validations():
    schedule = Schedule("plateau", 1e-3, 0, 100, 0.0)
    schedule.observe(10.0, higher_is_better=True)
    schedule.observe(9.0, higher_is_better=True)
    assert schedule.lr(5) == 1e-3
    schedule.observe(10.0, higher_is_better=True)  # equal is not better
    assert schedule.lr(5) == 5e-4
    schedule.observe(12.0, higher_is_better=True)
    schedule.observe(11.0, higher_is_better=True)
    assert schedule.lr(5) == 5e-4  # an improvement reset the count
    loss = Schedule("plateau", 1e-3, 0, 100, 0.0)
    for value in (2.0, 2.5, 2.1):  # lower is better
        loss.observe(value, higher_is_better=False)
    assert loss.lr(5) == 5e-4


def test_only_plateau_listens_to_validation():
    schedule = Schedule("inverse_sqrt", 1e-3, 0, 100, 0.0)
    for _ in range(5):
        schedule.observe(1.0, higher_is_better=True)
    assert schedule.lr(4) == pytest.approx(1e-3 / 2) and schedule.state_dict()["factor"] == 1.0


def test_schedule_state_dict_round_trip():
    schedule = Schedule("plateau", 1e-3, 0, 100, 1e-6)
    for value in (3.0, 2.0, 2.0, 1.0):
        schedule.observe(value, higher_is_better=True)
    state = json.loads(json.dumps(schedule.state_dict()))  # plain numbers only
    fresh = Schedule("plateau", 1e-3, 0, 100, 1e-6)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == schedule.state_dict()
    assert [fresh.lr(s) for s in range(1, 20)] == [schedule.lr(s) for s in range(1, 20)]


def test_weight_decay_only_on_matrices():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer = make_optimizer(model, TrainConfig(weight_decay=0.1, lr=1e-3, betas=(0.8, 0.9)))
    decay, no_decay = optimizer.param_groups
    assert [p.shape for p in decay["params"]] == [torch.Size([3, 4])] and decay["weight_decay"] == 0.1
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0  # bias, LayerNorm weight and bias
    assert decay["betas"] == (0.8, 0.9)
    set_lr(optimizer, 5e-4)
    assert [g["lr"] for g in optimizer.param_groups] == [5e-4, 5e-4]


def test_the_fused_adamw_gives_the_per_tensor_loops_update():
    """make_optimizer's AdamW is the fused kernel; it follows torch's plain AdamW (the oracle) to rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    cfg = TrainConfig(weight_decay=0.1, lr=1e-2, betas=(0.9, 0.98))
    fused = make_optimizer(model, cfg)
    assert all(g["fused"] for g in fused.param_groups)
    groups = [{"params": [p for p in twin.parameters() if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in twin.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    plain = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98), foreach=False)
    for _ in range(5):
        x = torch.randn(4, 8)
        for net, optimizer in ((model, fused), (twin, plain)):
            optimizer.zero_grad()
            net(x).pow(2).sum().backward()
            optimizer.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    moved = [float((a - s).detach().abs().max()) for a, s in zip(model.parameters(), start.parameters())]
    assert min(moved) > 1e-3  # every tensor was updated, by far more than the tolerance
