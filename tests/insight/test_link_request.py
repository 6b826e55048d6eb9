"""``align``'s option rules, owned by the library (``attnmt/insight/link_request.py``): each rule as one
ConfigError line naming the options, the same whoever asks; the command line's own tests of them are in
``tests/cli/test_cli_looking.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnmt.errors import ConfigError
from attnmt.insight.link_request import AlignRequest, Heads, Layer, check_request

T = Path("tgt.txt")


@pytest.mark.parametrize("request_, message", [
    (AlignRequest(threshold=0.0), "--threshold 0.0: expected a weight in (0, 1]"),
    (AlignRequest(gold=Path("g")), "--gold needs --tgt"),
    (AlignRequest(tgt=T, hyp_out=Path("h")), "--hyp-out writes the model's own translations"),
    (AlignRequest(symmetrize="union"), "--symmetrize combines two directions: it needs --reverse MODEL"),
    (AlignRequest(source="saliency", layer=Layer.parse("2")), "--layer chooses what attention is read"),
    (AlignRequest(calibrate=Path("c")), "--calibrate needs --tgt"),
    (AlignRequest(tgt=T, calibrate=Path("c"), heads=Heads.parse("1")), "it cannot be used with --heads"),
])
def test_each_rule_is_one_line_naming_the_options(request_, message):
    with pytest.raises(ConfigError) as info:
        check_request(request_)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_what_goes_together_passes():
    check_request(AlignRequest(tgt=T, gold=Path("g"), layer=Layer.parse("last"), heads=Heads.parse("1,3"),
                               reverse=Path("r"), symmetrize="grow-diag-final-and"))
    check_request(AlignRequest(tgt=T, calibrate=Path("c")))


@pytest.mark.parametrize("text, index", [("avg", None), ("last", -1), ("1", 0), (" 3 ", 2)])
def test_layers_parse(text, index):
    assert Layer.parse(text).index == index


@pytest.mark.parametrize("text, indices", [("all", None), ("3,1,3", (0, 2)), ("2", (1,))])
def test_heads_parse(text, indices):
    assert Heads.parse(text).indices == indices


@pytest.mark.parametrize("parse, text", [(Layer.parse, "0"), (Layer.parse, "first"), (Heads.parse, "0"),
                                         (Heads.parse, "a,b"), (Heads.parse, ",")])
def test_bad_layers_and_heads_are_value_errors(parse, text):
    with pytest.raises(ValueError):
        parse(text)


def test_a_layer_or_head_the_model_lacks_names_the_option_and_the_model():
    with pytest.raises(ConfigError, match=r"^--layer 4: the --reverse model has 3 cross-attention layer"):
        Layer.parse("4").check(3, "--reverse ")
    with pytest.raises(ConfigError, match=r"^--heads 1,5: the model has 4 attention head\(s\) per layer"):
        Heads.parse("1,5").check(4)
    Layer.parse("avg").check(1)
    Heads.parse("all").check(1)


@pytest.mark.parametrize("objective, null", [("links", True), ("predict", False)])
def test_the_alignment_layer_is_read_with_a_null_word_only_if_it_was_taught_links(objective, null):
    from attnmt.config.schema import config_from_dict
    from attnmt.insight.link_request import reading
    from attnmt.insight.reading import default_align_options

    cfg = config_from_dict({
        "data": {"src_lang": "en", "tgt_lang": "de",
                 "train": {"format": "toy", "split": "train", "size": 9}},
        "model": {"arch": "transformer", "d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 2},
        "train": {"alignment": {"module": "layer", "objective": objective}},
    })  # fmt: skip
    assert default_align_options(cfg).null is null
    layer, _, options = reading(cfg, None, None)
    assert layer.kind == options.kind == "align" and options.null is null
