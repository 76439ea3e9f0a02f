"""Simulation tops of the end-to-end run (host/e2e): the CXL NDP device with per-descriptor cycle stamps."""
