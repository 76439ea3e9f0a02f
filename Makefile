# ndpim — every target creates .venv and installs what it needs on first use (Python >= 3.11 and gcc only).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
NDPIM  := $(VENV)/bin/ndpim
STAMP  := $(VENV)/.installed
SYNTH_STAMP := $(VENV)/.installed-synth
# pytest workers: the machine (and CI) has 2 cores.
JOBS   ?= 2

.PHONY: demo test verilog lint cocotb synth synth-fast synth-paper ports calibrate fp-report bench-fp bench-dram bench-ndp bench-ndp-device bench-cxl-devmem bench-pim bench-host bench-e2e bench-energy fuzz clean

# Bytecode: pip compiles every installed file on one core (43 s of the 72 s install, measured); the packages'
# own test folders are never imported, so the rest is compiled on all cores instead (22 s less). Without it,
# every process would compile what it imports afresh wherever PYTHONDONTWRITEBYTECODE is set. A file that does
# not compile only loses its cache, so compileall's status is not an error here.
BYTECODE = $(PY) -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib hdl sim host firmware > /dev/null || true

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "ndpim needs Python >= 3.11: make PYTHON=python3.11 ...")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -e '.[test]'
	$(BYTECODE)
	touch $@

$(SYNTH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-compile --disable-pip-version-check -e '.[test,synth]'
	$(BYTECODE)
	touch $@

# The main job: a tiny LLaMA-style model decoding through the RTL of both devices (docs/e2e.md); ndpim demo --help.
DEMO_ARGS ?=
demo: $(STAMP)
	$(NDPIM) demo $(DEMO_ARGS)

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

# Word-level cell counts in seconds (proc; flatten; stat), with progress.
synth-fast: $(SYNTH_STAMP)
	$(NDPIM) synth --mode fast

# The paper-geometry NDP core and its 64-channel device memory, per distinct module x instance count, SRAMs as
# macros (sim/synth/hier.py; docs/ndp_core.md "Synthesis at the paper geometry"): build/bench/ndp_synth.json.
# The PE array's own glue is elaborated for its counts and memories only: its RTLIL conversion at 512 lanes
# exceeds the memory of the machine (docs/ndp_core.md).
synth-paper: $(SYNTH_STAMP)
	$(NDPIM) synth --top ndp_core --preset paper --mode hier --counts-only PEArray --json build/bench/ndp_synth.json

# The generated page of every top's port bit layouts.
ports: $(STAMP)
	$(NDPIM) ports --out docs/ports.md

# Re-measure the end-to-end run's timing models on the RTL (data/e2e_*_calibration.json).
calibrate: $(STAMP)
	$(NDPIM) e2e calibrate

bench-fp: $(STAMP)
	$(NDPIM) bench fp

bench-dram: $(STAMP)
	$(NDPIM) bench dram && $(NDPIM) bench devmem --verilog --synth

bench-ndp: $(STAMP)
	$(NDPIM) bench ndp

# The NDP core's exact slice on the LPDDR5X device memory (Verilator): E4 and 4K attention bit-exact vs golden,
# model vs RTL; writes build/bench/ndp_device.json (docs/ndp_perf.md).
bench-ndp-device: $(STAMP)
	$(NDPIM) bench ndp-device
	$(NDPIM) bench ndp-device --timing-only
	$(NDPIM) bench ndp-device --kernel attention_grouped --channels 4

# DIMM-PIM: model tables (cycles, utilization to 128K tokens, system bandwidth, ranksets, FP16 / FP32-accumulator
# accuracy), TINY and the PAPER rank through the RTL against the model, ranksets in RTL, fused-top cycles/s;
# writes build/bench/pim.json.
# The CXL device (front end, queues, NDP core) on the LPDDR5X device memory against the burst memory: GEMV cycles,
# bandwidth, build cost, cycles/s; writes build/bench/cxl_devmem.json (docs/cxl.md).
bench-cxl-devmem: $(STAMP)
	$(NDPIM) bench cxl-devmem

bench-pim: $(STAMP)
	$(NDPIM) bench pim --all-rtl

# Host model: serving-engine speed, GPU-model held-out error, and the PLoRA / L3 system grids when present
# (plora_grid_s, l3_grid_s); writes build/bench/host.json.
bench-host: $(STAMP)
	$(NDPIM) bench host

# End-to-end run: wall time per backend, model-vs-RTL error; writes build/bench/e2e.json.
bench-e2e: $(STAMP)
	$(NDPIM) bench e2e

# DRAM energy per bit of sequential and random reads on both memories (DRAMPower method, datasheet currents),
# the outside model (energydram) on the same streams, RTL vs fast-model energy; writes build/bench/energy.json
# (docs/energy.md).
bench-energy: $(STAMP)
	$(NDPIM) bench energy

# Long CXL device fuzz campaign (Verilator, both cores): ~20-50 ms per case per core, so FUZZ_CASES=1000000
# takes hours.
FUZZ_CASES ?= 1000000
fuzz: $(STAMP)
	$(NDPIM) fuzz --cases $(FUZZ_CASES) --jobs $(JOBS)

clean:
	rm -rf build sim_build .pytest_cache
