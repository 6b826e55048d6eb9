# Two entry points: `make demo` (the main job on the embedded toy task) and `make test`.
# Each creates the virtual environment .venv on first use. torch is pinned and installed first:
# an unpinned torch would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
RUN := runs/demo

.PHONY: demo test lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/attnmt prepare configs/toy_transformer.yaml --run-dir $(RUN)

test: $(BIN)/.installed
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg $(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check attnmt tests scripts

clean:
	rm -rf $(RUN)
