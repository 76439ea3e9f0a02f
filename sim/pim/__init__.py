"""Simulation tops and models of the DIMM-PIM ([L3] 4; docs/references.md)."""
