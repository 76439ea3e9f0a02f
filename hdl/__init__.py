"""Synthesizable Amaranth HDL of ndpim. Imports nothing from ``sim`` or ``host``."""
