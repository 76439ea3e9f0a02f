"""Simulation tops around the CXL NDP device."""
