"""Simulation backends: one stream-testbench interface over Amaranth's simulator and Verilator."""

from .base import (StreamPort, stream_ports, Traffic, StreamRun, Backend, SimulationTimeout,  # noqa: F401
                   ExtraOutput, DEFAULT_QUIET_CYCLES, BACKENDS, get_backend)
