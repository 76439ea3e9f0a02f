"""Simulation tops around the NDP core: a fixed-latency burst memory and the core with the real memory system."""
