# ndpim — every target creates .venv and installs what it needs on first use (Python >= 3.11 and gcc only).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
NDPIM  := $(VENV)/bin/ndpim
STAMP  := $(VENV)/.installed
SYNTH_STAMP := $(VENV)/.installed-synth
# pytest workers: the machine (and CI) has 2 cores.
JOBS   ?= 2

.PHONY: demo test verilog lint cocotb synth fp-report bench-fp bench-dram bench-ndp bench-pim fuzz clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ndpim needs Python >= 3.11: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

$(SYNTH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test,synth]'
	touch $@

demo: fp-report

test: $(STAMP)
	$(PY) -m pytest -n $(JOBS) -q --durations=25 tests

fp-report: $(STAMP)
	$(NDPIM) fp-report

verilog: $(STAMP)
	$(NDPIM) verilog --out build/verilog

lint: verilog
	$(NDPIM) lint build/verilog

cocotb: $(STAMP)
	$(PY) -m pytest -q tests/cocotb

synth: $(SYNTH_STAMP)
	$(NDPIM) synth

bench-fp: $(STAMP)
	$(NDPIM) bench-fp

bench-dram: $(STAMP)
	$(PY) -m sim.perf.dram_bench

bench-ndp: $(STAMP)
	$(PY) -m sim.perf.ndp_bench

# DIMM-PIM: model tables (cycles, utilization to 128K tokens, system bandwidth, ranksets, FP16 / FP32-accumulator
# accuracy), TINY and the PAPER rank through the RTL against the model, ranksets in RTL, fused-top cycles/s;
# writes build/bench/pim.json.
bench-pim: $(STAMP)
	$(PY) -m sim.perf.pim_bench --all-rtl

# Long CXL device fuzz campaign (Verilator, both cores): ~20-50 ms per case per core, so FUZZ_CASES=1000000
# takes hours.
FUZZ_CASES ?= 1000000
fuzz: $(STAMP)
	$(PY) -m sim.perf.cxl_fuzz --cases $(FUZZ_CASES) --jobs $(JOBS)

clean:
	rm -rf build sim_build .pytest_cache
