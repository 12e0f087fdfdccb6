# kvlab: every target does its own set-up. On a fresh machine with Python 3.11, pip,
# node and apt, `make book` and `make test` are all you need (see README).

PYTHON      ?= python3
VENV        ?= .venv
# The CPU torch wheel this project is tested with. On a GPU box keep the box's CUDA
# build instead:  make test TORCH_SPEC= VENV_FLAGS=--system-site-packages
TORCH_SPEC  ?= torch==2.13.0
VENV_FLAGS  ?=
BIN         := $(VENV)/bin
STAMP       := $(VENV)/.kvlab-installed
BUILD_DIR   := _build
HTML_DIR    := $(BUILD_DIR)/html
# Kernels, Chromium and Voila write into $HOME: give them a throw-away one.
RUN_HOME    := $(CURDIR)/$(BUILD_DIR)/home
SUDO        := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := chromium libibverbs1 fonts-noto-cjk

.PHONY: help venv system-deps lint book locale test test-fast dashboard labs jupyter bench bench-gpu gpu-session clean

help:
	@echo "make book       build the book (HTML in $(HTML_DIR)/index.html, Chinese in $(HTML_DIR)/zh/)"
	@echo "make locale     update the Chinese catalogues (locale/zh_CN) from the English pages"
	@echo "make test       the whole suite: lint, unit, property, CLI, notebooks, browser"
	@echo "make lint       ruff: the rules in pyproject.toml, and the formatting"
	@echo "make dashboard  serve the live dashboard with Voila on 127.0.0.1"
	@echo "make labs       write student copies of the labs (answers blanked) to labs/"
	@echo "make jupyter    JupyterLab on 127.0.0.1 for working through the labs"
	@echo "make bench      CPU microbenchmarks into results/<machine>/"
	@echo "make bench-gpu  the GPU sweeps (on a CUDA box, under 10 minutes)"
	@echo "make gpu-session OUT=DIR  one bounded GPU run, everything into DIR"

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"; fi
	$(BIN)/python -m pip install --quiet -r requirements.txt
	@touch $@

venv: $(STAMP)

system-deps:
	@missing=""; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	ldconfig -p | grep -q 'libibverbs.so.1 ' || missing="$$missing libibverbs1"; \
	command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	fc-list :lang=zh 2>/dev/null | grep -q . || missing="$$missing fonts-noto-cjk"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

# Where Python is told not to write bytecode (PYTHONDONTWRITEBYTECODE, as on the CI machine),
# each of the hundred-odd Python processes of a build and test run (pytest workers, notebook
# kernels, CLI runs, pool workers) would compile kvlab's sources again: compiled once here
# (half a second), every process reads them.
BYTECODE    = $(BIN)/python -m compileall -q -j 0 kvlab tests book/_ext

# Two editions: English into $(HTML_DIR), then Chinese (Sphinx gettext catalogues in
# locale/, configuration derived from _config.yml) into $(ZH_BUILD), copied to $(HTML_DIR)/zh.
ZH_BUILD    := $(BUILD_DIR)/zh
BOOK_FLAGS  := --warningiserror --nitpick --keep-going
# The chapters' expensive runs go into their caches first (kvlab.book.warm), so the two
# editions, built at once, read the same results; each build logs to
# $(BUILD_DIR)/book-<lang>.log, shown when it fails.
book: $(STAMP)
	@mkdir -p $(RUN_HOME) $(ZH_BUILD)
	$(BYTECODE)
	$(BIN)/python book/_ext/kvlab_i18n.py config zh_CN $(ZH_BUILD)/_config.yml
	HOME=$(RUN_HOME) $(BIN)/python -m kvlab.book.warm
	@echo "building the English and Chinese editions (logs: $(BUILD_DIR)/book-en.log, book-zh.log)"
	@HOME=$(RUN_HOME) KVLAB_BOOK_BUILD=1 $(BIN)/jupyter-book build . $(BOOK_FLAGS) \
	  > $(BUILD_DIR)/book-en.log 2>&1 & en=$$!; \
	HOME=$(RUN_HOME) KVLAB_BOOK_BUILD=1 KVLAB_BOOK_LANG=zh_CN $(BIN)/jupyter-book build . \
	  --config $(ZH_BUILD)/_config.yml --path-output $(ZH_BUILD) $(BOOK_FLAGS) \
	  > $(BUILD_DIR)/book-zh.log 2>&1 & zh=$$!; \
	wait $$en; en_rc=$$?; wait $$zh; zh_rc=$$?; \
	for lang in en zh; do tail -n 3 $(BUILD_DIR)/book-$$lang.log; done; \
	if [ $$en_rc != 0 ]; then cat $(BUILD_DIR)/book-en.log; fi; \
	if [ $$zh_rc != 0 ]; then cat $(BUILD_DIR)/book-zh.log; fi; \
	test $$en_rc = 0 && test $$zh_rc = 0
	rm -rf $(HTML_DIR)/zh && cp -r $(ZH_BUILD)/_build/html $(HTML_DIR)/zh
	@echo
	@echo "The book is built: $(CURDIR)/$(HTML_DIR)/index.html (中文: $(HTML_DIR)/zh/index.html)"
	@echo "Serve it with: $(BIN)/python -m http.server --bind 127.0.0.1 8000 --directory $(HTML_DIR)"

# Translators: refresh the catalogues from the English pages (new paragraphs appear
# untranslated, changed ones fuzzy), edit locale/zh_CN/LC_MESSAGES/**/*.po, run `make book`.
locale: $(STAMP)
	@mkdir -p $(RUN_HOME)
	HOME=$(RUN_HOME) KVLAB_BOOK_BUILD=1 $(BIN)/jupyter-book build . --builder custom \
	  --custom-builder gettext --path-output $(BUILD_DIR)/gettext
	$(BIN)/sphinx-intl update -p $(BUILD_DIR)/gettext/_build/gettext -l zh_CN -d locale

# Lint first: it takes a second and fails before the book build's minutes.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Three pytest workers (pytest-xdist) on two cores: part of the suite waits (on Chromium,
# kernels, servers, timed benchmarks), so a third worker overlaps those waits; a fourth
# only added contention (the whole suite, same checkout: 4 workers 267 s and 518 CPU s,
# 3 workers 256 s and 469 CPU s, 2 workers 292 s). Each takes whole files (module
# fixtures stay shared), slowest first; tests/conftest.py spreads the independent tests of
# its SPLIT_FILES one by one.
PYTEST_WORKERS ?= 3
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadfile --durations=15

test: $(STAMP) system-deps lint book
	@mkdir -p $(RUN_HOME)
	HOME=$(RUN_HOME) $(BIN)/python -m pytest $(PYTEST_PARALLEL)

# The suite without the book build and the browser.
test-fast: $(STAMP)
	@mkdir -p $(RUN_HOME)
	$(BYTECODE)
	HOME=$(RUN_HOME) $(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not browser and not notebook"

dashboard: $(STAMP)
	@mkdir -p $(RUN_HOME)
	HOME=$(RUN_HOME) $(BIN)/python -m kvlab dashboard --port $${PORT:-8866}

labs: $(STAMP)
	$(BIN)/python -m kvlab.labs notebooks labs
	@echo "Student copies (answers blanked) are in $(CURDIR)/labs/"

# JupyterLab on 127.0.0.1 for the labs (installed into .venv on first use; the book does not need it).
jupyter: $(STAMP)
	@$(BIN)/python -c "import jupyterlab" 2>/dev/null || $(BIN)/python -m pip install --quiet "jupyterlab>=4,<5"
	@mkdir -p labs
	$(BIN)/jupyter lab --ip=127.0.0.1 --port=$${PORT:-8888} --no-browser --notebook-dir=labs

# CPU microbenchmarks into results/<machine>/ (memory, transfer, recompute-vs-fetch, decode; the
# decode points also timed with PyTorch's CPU kernels, right after each: decode-torch-kernels).
# Where flock exists, heavy runs on a shared machine queue behind /tmp/kvlab-cpu.lock.
CPU_LOCK    := $(shell command -v flock >/dev/null 2>&1 && echo flock /tmp/kvlab-cpu.lock)
bench: $(STAMP)
	$(CPU_LOCK) $(BIN)/python -m kvlab bench all --device cpu

# On a CUDA box with only python3 + numpy + torch: no venv, no installs, under 10 minutes;
# results land in results/<gpu>/ (commit them), or in $(KVLAB_RESULTS_DIR)/<gpu>/ when set.
# GPU_BUDGET trims the suite (seconds); `make bench-gpu GPU_PLAN=1` prints the plan instead.
GPU_BUDGET  ?= 480
bench-gpu:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m kvlab bench gpu-suite --budget $(GPU_BUDGET) \
	  $(if $(GPU_PLAN),--plan h200)

# A borrowed GPU from which only the folder OUT comes back: facts, plan, suite, GPU tests,
# findings, in one call under 7 minutes (kvlab/bench/gpu_session.py; book page "Running on
# a GPU box").
gpu-session:
	@test -n "$(OUT)" || { echo "set OUT to the folder that comes back: make gpu-session OUT=..."; exit 2; }
	PYTHONPATH=$(CURDIR) $(PYTHON) -m kvlab bench gpu-session --out "$(OUT)"

clean:
	rm -rf $(BUILD_DIR) labs
