"""Simulation top of the CXL device's memory system (hdl/memctl/devmem.py) with N DRAM channel models."""
