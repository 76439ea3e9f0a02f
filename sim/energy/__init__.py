"""Energy models: DRAM energy from command traces (docs/energy.md)."""
