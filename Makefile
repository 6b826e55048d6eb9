# Two entry points: `make demo` (the main job on the embedded toy task) and `make test`.
# Each creates the virtual environment .venv on first use. torch is pinned and installed first:
# an unpinned torch would pull a multi-GB CUDA build. pip's own output goes to .venv/install.log
# (shown if the set-up fails), so that a first run prints one line instead of pages of notices.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
RUN := runs/demo

.PHONY: demo test lint clean

$(BIN)/.installed: pyproject.toml
	@echo "setting up $(VENV): $(TORCH) (CPU), attnmt and its dependencies (log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(BIN)/pip install --upgrade pip && $(BIN)/pip install $(TORCH) && $(BIN)/pip install -e '.[dev]'; } \
		> $(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log; echo "set-up failed; the whole log: $(VENV)/install.log"; exit 1; }
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/attnmt train configs/toy_transformer.yaml --run-dir $(RUN)
	$(BIN)/attnmt translate $(RUN) "tuesday , march 14th , 2019 at 7:05 pm" "friday the 1st of may 2001" "november 19th 1982"
	$(BIN)/attnmt toy-data $(RUN)/toy --train-size 1 --dev-size 1 --test-size 300
	$(BIN)/attnmt eval $(RUN) --src $(RUN)/toy/test.en --ref $(RUN)/toy/test.de

test: $(BIN)/.installed
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg $(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check attnmt tests scripts

clean:
	rm -rf $(RUN)
