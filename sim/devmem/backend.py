"""Verilator backend for components that write their own Verilog (``verilog_text(name)``), e.g. the hierarchical
build of :class:`sim.devmem.system.DeviceMemorySystem`; otherwise the same as ``get_backend("verilator")``.

The harness, its cache and the stream protocol are sim/backends' own (:func:`sim.backends.verilator.build_executable`);
only the Verilog text differs."""

from sim.backends.verilator import VerilatorBackend, build_executable
from sim.backends.base import stream_ports
from sim.backends import get_backend

__all__ = ["HierarchicalVerilatorBackend", "backend"]


class HierarchicalVerilatorBackend(VerilatorBackend):
    name = "verilator"

    def executable(self, component):
        if not hasattr(component, "verilog_text"):
            return super().executable(component)
        exe = self._exes.get(component)
        if exe is None or not exe.exists():
            exe = build_executable(component.verilog_text("top"), stream_ports(component))
            self._exes[component] = exe
        return exe


_backends = {}


def backend(name: str):
    """``"verilator"``: :class:`HierarchicalVerilatorBackend`; ``"amaranth"``: the Amaranth simulator backend."""
    if name not in _backends:
        _backends[name] = HierarchicalVerilatorBackend() if name == "verilator" else get_backend(name)
    return _backends[name]
