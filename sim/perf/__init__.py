"""Fast performance models calibrated against the RTL (see docs/dram_perf.md)."""
