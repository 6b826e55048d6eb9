"""``models/footprint.py`` sizes a model on the meta device before building it: every parameter and buffer
there has the shape and dtype of the real build (initialisers skipped, the sinusoid table left empty), and
the check imports nothing the real build would not (before initialisers were skipped, ``normal_`` on a
meta tensor imported torch._dynamo: a second of CPU in every command that loads a model)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import REPO, train_env

from attnmt.config.schema import LSTMConfig, TrainConfig, TransformerConfig
from attnmt.models import build_model
from attnmt.models.footprint import fits_in_memory, model_bytes
from attnmt.models.transformer import SINUSOIDS

MODELS = {
    "sinusoidal": TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=2,
                                    d_ff=32, max_positions=40),
    "sinusoidal_concat": TransformerConfig(arch="transformer", d_model=15, n_heads=3, enc_layers=1,
                                           dec_layers=1, d_ff=32, positions="sinusoidal_concat"),
    "learned": TransformerConfig(arch="transformer", d_model=16, n_heads=2, enc_layers=1, dec_layers=1,
                                 d_ff=32, positions="learned", max_positions=30),
    "lstm": LSTMConfig(arch="lstm", emb_dim=8, hidden_size=8, enc_layers=1, dec_layers=1),
}
LAYER = TrainConfig.model_validate({"alignment": {"module": "layer", "feed_forward": True, "shift": True,
                                                  "layer": 1, "path": "x.align"}})


@pytest.mark.parametrize("name", MODELS)
def test_the_meta_build_has_the_real_build_s_shapes(name):
    train = LAYER if MODELS[name].arch == "transformer" else None
    build = lambda: build_model(MODELS[name], 23, 23, train=train)  # noqa: E731
    meta, real = fits_in_memory(build, "test"), build()

    def shapes(model):
        return {n: (tuple(t.shape), t.dtype) for n, t in [*model.named_parameters(), *model.named_buffers()]}

    assert all(t.is_meta for _, t in meta.named_parameters())
    assert shapes(meta) == shapes(real)
    assert model_bytes(meta) == model_bytes(real)
    assert not any(t.is_meta for _, t in real.named_parameters())
    if name.startswith("sinusoidal"):  # the real table is the waves, not an empty tensor's leftovers
        cfg = MODELS[name]
        waves = SINUSOIDS[name](torch.arange(cfg.max_positions), cfg.d_model)
        assert torch.equal(real.positions.table, waves)


def test_sizing_a_model_imports_no_compiler():
    probe = ("import sys; from attnmt.models import build_model; from attnmt.models.footprint import "
             "fits_in_memory; from attnmt.config.schema import TransformerConfig; "
             "cfg = TransformerConfig(arch='transformer', d_model=16, n_heads=2, enc_layers=1, dec_layers=1, "
             "d_ff=32); fits_in_memory(lambda: build_model(cfg, 9, 9), 'probe'); "
             "print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=train_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
