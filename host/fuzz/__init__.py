"""Fuzz campaigns: host/fuzz/cxl.py drives the CXL NDP device RTL through the host driver (`ndpim fuzz`)."""
