"""Everything that runs the hardware but is not hardware: golden models, DRAM models, backends, perf models."""
