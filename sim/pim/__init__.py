"""Simulation tops and models of the DIMM-PIM (L3, ../shared/papers/l3.txt section 4)."""
