"""The large-corpus recipe as shipped (``configs/wmt14_en_de_transformer_base.yaml``) builds and trains on the
CPU: its data swapped for the toy task (WMT14 is not shipped), its batch cut to a hundred tokens, its
warmup to two steps, one save (a checkpoint of this model and its AdamW state is about 530 MB) and
validation outputs of 5 pieces; its model and accumulation as they are. In-process (``CliRunner``): the
test is about the recipe, not the process."""

from __future__ import annotations

import json

import pytest
import yaml
from helpers import CONFIGS, read_records
from typer.testing import CliRunner

from attnmt.cli import app

BASE_RECIPE = CONFIGS / "wmt14_en_de_transformer_base.yaml"

pytestmark = pytest.mark.usefixtures("restore_torch_state")  # in-process training: conftest.py


def test_the_transformer_base_recipe_trains_a_few_steps_on_the_cpu(tmp_path):
    config = yaml.safe_load(BASE_RECIPE.read_text(encoding="utf-8"))
    assert (config["model"]["d_model"], config["model"]["enc_layers"], config["model"]["n_heads"],
            config["model"]["d_ff"], config["tokenizer"]["vocab_size"]) == (512, 6, 8, 2048, 32000)
    assert config["train"]["max_tokens"] * config["train"]["accum_steps"] == 25000
    config["data"].update(train={"format": "toy", "split": "train", "size": 200},
                          dev={"format": "toy", "split": "dev", "size": 4}, test=None)
    config["tokenizer"].update(vocab_size=200, hard_vocab_limit=False)
    config["train"].update(max_tokens=100, warmup_steps=2, max_steps=3, eval_every=3, save_every=1000,
                           log_every=1, precision="fp32", device="cpu")
    config["decode"].update(max_len_a=0.0, max_len_b=5)  # validation of a model that has not learnt yet
    path = tmp_path / "base.yaml"
    path.write_text(json.dumps(config), encoding="utf-8")
    result = CliRunner().invoke(app, ["train", str(path), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    losses = [r["loss"] for r in read_records(tmp_path / "run")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    assert best["file"] == f"step_{3:08d}.pt"
