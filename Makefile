# Two entry points: `make demo` (the main job on the embedded toy task) and `make test`.
# Each creates the virtual environment .venv on first use. torch is pinned and installed first:
# an unpinned torch would pull a multi-GB CUDA build. pip's own output goes to .venv/install.log
# (shown if the set-up fails), so that a first run prints one line instead of pages of notices.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.13.0
RUN := runs/demo
# The browser tests (tests/insight/test_explorer.py) drive Debian's /usr/bin/chromium through /usr/bin/chromedriver;
# `make test` installs both when either is missing, with sudo only when not root and sudo exists.
SUDO := $(shell [ "$$(id -u)" = 0 ] || ! command -v sudo >/dev/null 2>&1 || echo sudo)

.PHONY: demo test lint clean browser docs docs-serve

$(BIN)/.installed: pyproject.toml
	@echo "setting up $(VENV): $(TORCH) (CPU), attnmt and its dependencies (log: $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@{ $(BIN)/pip install --upgrade pip && $(BIN)/pip install $(TORCH) && $(BIN)/pip install -e '.[dev,ct2,tensorboard,attribute,align,serve,docs]'; } \
		> $(VENV)/install.log 2>&1 || { tail -n 30 $(VENV)/install.log; echo "set-up failed; the whole log: $(VENV)/install.log"; exit 1; }
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/attnmt train configs/toy_transformer.yaml --run-dir $(RUN)
	$(BIN)/attnmt translate $(RUN) "tuesday , march 14th , 2019 at 7:05 pm" "friday the 1st of may 2001" "november 19th 1982"
	$(BIN)/attnmt toy-data $(RUN)/toy --train-size 1 --dev-size 1 --test-size 300
	$(BIN)/attnmt eval $(RUN) --src $(RUN)/toy/test.en --ref $(RUN)/toy/test.de

browser:
	@[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || { \
		echo "installing chromium and chromium-driver for the browser tests (log: $(VENV)/browser.log)"; \
		mkdir -p $(VENV); \
		{ $(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y \
			--no-install-recommends chromium chromium-driver; } > $(VENV)/browser.log 2>&1 \
		&& [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] \
		|| { echo "could not install chromium and chromium-driver (log: $(VENV)/browser.log); the browser tests need them: apt-get install chromium chromium-driver"; exit 1; }; }

# Two test processes, one per core (most tests run one thread); a file's tests stay in one process, so
# its module fixtures are made once. Files are handed out in collection order, where tests/conftest.py puts
# the longest first (xdist's own order, by number of tests, left a 110 s file of 3 tests to run alone last).
test: $(BIN)/.installed browser
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MPLBACKEND=Agg $(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

lint: $(BIN)/.installed
	$(BIN)/ruff check attnmt tests scripts docs/hooks

# The documentation site, built strictly (a broken link or a missing page fails) into site/; it opens from disk.
# docs-serve: the same at http://127.0.0.1:8000, rebuilt as docs/ or the code (the reference) changes.
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

docs-serve: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(RUN)
