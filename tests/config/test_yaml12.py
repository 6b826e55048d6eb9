"""yaml12.py on its own: YAML 1.2 core-schema scalars where PyYAML's SafeLoader reads YAML 1.1, duplicate keys
and aliases refused with their line and column, the line of every key, and the file checks. PyYAML's own
SafeLoader is the foil: each trap below is read differently by it."""

from __future__ import annotations

import pytest
import yaml

from attnmt.config.yaml12 import MAX_CONFIG_BYTES, parse_yaml, read_yaml_file
from attnmt.errors import ConfigError


def parsed(text: str):
    return parse_yaml(text, "cfg.yaml")[0]


@pytest.mark.parametrize(
    "text, ours, yaml11",
    [
        ("a: no", "no", False),
        ("a: yes", "yes", True),
        ("a: on", "on", True),
        ("a: 1e-3", 0.001, "1e-3"),
        ("a: 1:30", "1:30", 90),
        ("a: 0x10", 16, 16),
        ("a: 0o17", 15, "0o17"),
        ("a: 1_000", 1000, 1000),
        ("a: true", True, True),
        ("a: .inf", float("inf"), float("inf")),
        ("a: -.5", -0.5, "-.5"),
    ],
)
def test_scalars_follow_yaml_1_2_where_yaml_1_1_differs(text, ours, yaml11):
    assert parsed(text) == {"a": ours}
    assert yaml.safe_load(text) == {"a": yaml11}


@pytest.mark.parametrize("value", ["010", "-012", "00", "+07"])
def test_leading_zeros_are_an_error_naming_line_and_column(value):
    with pytest.raises(ConfigError) as info:
        parse_yaml(f"x: 1\nb: {value}\n", "cfg.yaml")
    assert str(info.value).startswith("cfg.yaml:2:4: YAML error: ")
    assert "leading zeros are not allowed" in str(info.value)


def test_a_duplicate_key_names_both_lines():
    with pytest.raises(ConfigError) as info:
        parse_yaml("a:\n  lr: 1\n  lr: 2\n", "cfg.yaml")
    assert str(info.value) == "cfg.yaml:3:3: YAML error: duplicate key 'lr' (first defined on line 2)"
    assert yaml.safe_load("a:\n  lr: 1\n  lr: 2\n") == {"a": {"lr": 2}}  # what PyYAML would silently keep


def test_aliases_are_refused_where_they_are_used():
    with pytest.raises(ConfigError, match=r"^cfg\.yaml:2:8: YAML error: aliases are not allowed"):
        parse_yaml("a: &x [1, 2]\nb: [1, *x]\n", "cfg.yaml")


def test_syntax_errors_name_line_and_column():
    with pytest.raises(ConfigError, match=r"^cfg\.yaml:2:1: YAML syntax error: "):
        parse_yaml("a:\n\tb: 1\n", "cfg.yaml")


def test_the_line_of_every_key_and_list_item():
    data, lines = parse_yaml("# a comment\ndata:\n  train:\n    src: x\nbetas: [0.9,\n  0.98]\n", "cfg.yaml")
    assert data == {"data": {"train": {"src": "x"}}, "betas": [0.9, 0.98]}
    assert lines == {("data",): 2, ("data", "train"): 3, ("data", "train", "src"): 4, ("betas",): 5,
                     ("betas", "0"): 5, ("betas", "1"): 6}


def test_an_empty_document_is_none():
    assert parse_yaml("# nothing\n", "cfg.yaml") == (None, {})


def test_read_yaml_file_checks_the_file(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("a: no\n", encoding="utf-8")
    assert read_yaml_file(good) == ({"a": "no"}, {("a",): 1})
    with pytest.raises(ConfigError, match="config file not found"):
        read_yaml_file(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        read_yaml_file(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: \xff\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid UTF-8 at byte offset 3"):
        read_yaml_file(bad)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        read_yaml_file(big)
