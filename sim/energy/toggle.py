"""Per-operation energy of a mapped unit from its switching: a zero-delay gate-level simulation of the NanGate45
netlist (the one :mod:`sim.energy.area` maps) under random operands, toggle counts x a stated per-cell energy
(issue 33 item 2's first form; the FPMAC is the unit it is run on, beside Horowitz's per-op figure).

Energy of one cycle = sum over cell outputs that toggled of (the cell's internal energy per output transition
:data:`CELL_FJ` ``out_fj`` + 1/2 C_load V^2, C_load = the input-pin capacitances the net drives, from the
liberty) + for every flip-flop its clock-pin internal energy per cycle (``clk_fj``), at V = 1.1 V (the library's
nominal supply). Zero-delay: glitches are not counted and wires have no capacitance, so this is a lower bound on
the switching of a placed netlist; the clock tree itself is not counted.
"""

import json
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from sim.energy.area import LIBERTY_PATH, _groups

__all__ = ["CELL_FJ", "VDD", "liberty_cells", "mapped_netlist", "GateSim", "fpmac_toggle_energy"]

#: The library's nominal supply (NangateOpenCellLibrary typical: "nom_voltage : 1.10").
VDD = 1.1

#: fJ per output transition (``out_fj``) and per clock cycle on the clock pin (``clk_fj``) of each mapped cell:
#: from the full NanGate typical liberty (OpenSTA d1b2b396 examples/nangate45_typ.lib.gz, the file
#: data/liberty/nangate45_typ_min.lib is reduced from): each ``internal_power`` group of the cell's output pins
#: (and, for ``clk_fj``, of its CK pin), the table value at the third index of both axes (input transition
#: 17.2 ps, output load 3.71 fF: the tables' 0.0172 ns / 3.7098 fF point), mean over the groups of
#: (rise_power + fall_power) / 2 per transition; ``clk_fj`` = rise + fall (one of each per cycle).
CELL_FJ = {
    "AND2_X1": (2.5844, 0.0), "AOI21_X1": (2.0467, 0.0), "AOI22_X1": (2.1963, 0.0), "BUF_X1": (2.3525, 0.0),
    "DFFR_X1": (2.8549, 9.6087), "DFFS_X1": (3.013, 9.9149), "DFF_X1": (4.2082, 7.2024), "INV_X1": (0.9484, 0.0),
    "MUX2_X1": (3.2644, 0.0), "NAND2_X1": (1.3418, 0.0), "NAND3_X1": (1.7981, 0.0), "NOR2_X1": (1.3529, 0.0),
    "NOR3_X1": (1.7179, 0.0), "OAI21_X1": (1.9532, 0.0), "OAI22_X1": (2.1778, 0.0), "OR2_X1": (2.4938, 0.0),
    "XNOR2_X1": (2.8881, 0.0), "XOR2_X1": (2.9475, 0.0),
}


def _expr(func):
    """A liberty function (``!``, ``&``, ``^``, ``|``, parentheses) as a Python expression over 0/1 ints."""
    toks = re.findall(r"\w+|[!&|^()]", func)
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        pos[0] += 1
        return toks[pos[0] - 1]

    def atom():
        t = take()
        if t == "!":
            return f"(1^{atom()})"
        if t == "(":
            e = orx()
            if take() != ")":
                raise ValueError(f"liberty function {func!r}: unbalanced parentheses")
            return e
        if not re.fullmatch(r"\w+", t):
            raise ValueError(f"liberty function {func!r}: unexpected {t!r}")
        return f"v[{t!r}]"

    def andx():
        e = atom()
        while peek() == "&":
            take()
            e = f"({e}&{atom()})"
        return e

    def xorx():
        e = andx()
        while peek() == "^":
            take()
            e = f"({e}^{andx()})"
        return e

    def orx():
        e = xorx()
        while peek() == "|":
            take()
            e = f"({e}|{xorx()})"
        return e
    out = orx()
    if peek() is not None:
        raise ValueError(f"liberty function {func!r}: trailing {peek()!r}")
    return out


def liberty_cells(path=LIBERTY_PATH):
    """``{cell: {"pins": {pin: (direction, capacitance fF, function or None)}, "ff": {...} or None}}``."""
    cells = {}
    for name, body in _groups(Path(path).read_text(), "cell"):
        pins = {}
        for pn, pb in _groups(body, "pin"):
            d = re.search(r"direction\s*:\s*(\w+)", pb).group(1)
            cap = re.search(r"^\s*capacitance\s*:\s*([\d.]+)", pb, re.M)
            fn = re.search(r'function\s*:\s*"([^"]+)"', pb)
            pins[pn] = (d, float(cap.group(1)) if cap else 0.0, fn.group(1) if fn else None)
        ff = None
        m = re.search(r"\bff\s*\(\s*\"?(\w+)\"?\s*,\s*\"?(\w+)\"?\s*\)\s*\{([^}]*)\}", body)
        if m:
            attrs = dict(re.findall(r"(\w+)\s*:\s*\"([^\"]+)\"", m.group(3)))
            ff = {"iq": m.group(1), "iqn": m.group(2), **attrs}
        cells[name] = {"pins": pins, "ff": ff}
    return cells


def mapped_netlist(name, component, liberty=LIBERTY_PATH):
    """Yosys JSON of ``component`` flattened and mapped to ``liberty`` (the script of :mod:`sim.energy.area`)."""
    from amaranth.back import rtlil
    from sim.synth.hier import SYNTH_NOMAP
    from sim.synth.yosys import _yosys
    text = rtlil.convert(component, name=name, emit_src=False)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / f"{name}.il").write_text(text)
        (Path(tmp) / "cells.lib").write_text(Path(liberty).read_text())
        script = (f"read_rtlil {name}.il; " + SYNTH_NOMAP.format(top=name)
                  + "; dfflibmap -liberty cells.lib; abc -liberty cells.lib; opt_clean; write_json net.json")
        out = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True, cwd=tmp)
        if out.returncode:
            raise RuntimeError(f"yosys failed on {name}:\n{(out.stdout + out.stderr)[-3000:]}")
        return json.loads((Path(tmp) / "net.json").read_text())["modules"][name]


class GateSim:
    """Zero-delay cycle simulation of a mapped netlist (:func:`mapped_netlist`) with toggle counting."""

    def __init__(self, netlist, liberty=LIBERTY_PATH):
        lib = liberty_cells(liberty)
        self.ports = {p: v["bits"] for p, v in netlist["ports"].items()}
        nbits = 2 + max([b for v in self.ports.values() for b in v if isinstance(b, int)] +
                        [b for c in netlist["cells"].values() for bs in c["connections"].values() for b in bs
                         if isinstance(b, int)])
        self.v = [0] * nbits
        self.load = [0.0] * nbits                     # fF of input pins each net drives
        comb, self.flops = [], []
        for cname, c in netlist["cells"].items():
            if c["type"] == "$scopeinfo":                # hierarchy bookkeeping of flatten, no logic
                continue
            if c["type"] not in lib:
                raise ValueError(f"cell {cname}: type {c['type']} is not in the liberty")
            cell = lib[c["type"]]
            conn = {p: (bs[0] if isinstance(bs[0], int) else -1 - int(bs[0] == "1"))
                    for p, bs in c["connections"].items()}
            for p, b in conn.items():
                d, cap, _f = cell["pins"][p]
                if d == "input" and isinstance(c["connections"][p][0], int):
                    self.load[b] += cap
            ins = {p: conn[p] for p, (d, _c, _f) in cell["pins"].items() if d == "input" and p in conn}
            outs = {p: conn[p] for p, (d, _c, _f) in cell["pins"].items() if d == "output" and p in conn}
            if cell["ff"]:
                self.flops.append((c["type"], ins, outs, cell))
            else:
                fns = {p: eval("lambda v: " + _expr(cell["pins"][p][2])) for p in outs}  # noqa: S307 (liberty)
                comb.append((c["type"], ins, outs, fns))
        self.comb = self._order(comb)
        self.toggles = {}                              # cell type -> output toggles
        self.energy_fj = 0.0
        self.cycles = 0

    def _order(self, comb):
        driver = {b: i for i, (_t, _i, outs, _f) in enumerate(comb) for b in outs.values()}
        deps = [{driver[b] for b in ins.values() if b in driver} for _t, ins, _o, _f in comb]
        order, state = [], [0] * len(comb)
        for start in range(len(comb)):
            stack = [(start, False)]
            while stack:
                i, done = stack.pop()
                if done:
                    if state[i] != 2:
                        state[i] = 2
                        order.append(i)
                    continue
                if state[i]:
                    if state[i] == 1:
                        continue
                    continue
                state[i] = 1
                stack.append((i, True))
                stack.extend((j, False) for j in deps[i] if state[j] == 0)
        return [comb[i] for i in order]

    def _get(self, b):
        return (-1 - b) if b < 0 else self.v[b]

    def set_port(self, port, value):
        for k, b in enumerate(self.ports[port]):
            if isinstance(b, int):
                self.v[b] = (value >> k) & 1

    def get_port(self, port):
        return sum(self.v[b] << k for k, b in enumerate(self.ports[port]) if isinstance(b, int))

    def step(self, count=True):
        """Settle the logic on the current inputs, count toggles against the previous cycle, then clock."""
        v, e2 = self.v, 0.5 * VDD * VDD
        for ctype, ins, outs, fns in self.comb:
            vals = {p: self._get(b) for p, b in ins.items()}
            for p, b in outs.items():
                new = fns[p](vals)
                if new != v[b]:
                    v[b] = new
                    if count:
                        self.toggles[ctype] = self.toggles.get(ctype, 0) + 1
                        self.energy_fj += CELL_FJ[ctype][0] + e2 * self.load[b]
        nxt = []
        for ctype, ins, outs, cell in self.flops:
            ff = cell["ff"]
            vals = {p: self._get(b) for p, b in ins.items()}
            q = eval(_expr(ff["next_state"]), {}, {"v": vals})  # noqa: S307 (liberty)
            if "clear" in ff and eval(_expr(ff["clear"]), {}, {"v": vals}):  # noqa: S307
                q = 0
            if "preset" in ff and eval(_expr(ff["preset"]), {}, {"v": vals}):  # noqa: S307
                q = 1
            nxt.append((ctype, outs, cell, q))
        for ctype, outs, cell, q in nxt:
            ff = cell["ff"]
            for p, b in outs.items():
                fn = cell["pins"][p][2]
                new = q if fn == ff["iq"] else 1 - q
                if new != v[b]:
                    v[b] = new
                    if count:
                        self.toggles[ctype] = self.toggles.get(ctype, 0) + 1
                        self.energy_fj += CELL_FJ[ctype][0] + e2 * self.load[b]
            if count:
                self.energy_fj += CELL_FJ[ctype][1]
        if count:
            self.cycles += 1


def _f16_bits(x):
    return int(np.float16(x).view(np.uint16))


def _f32_bits(x):
    return int(np.float32(x).view(np.uint32))


def fpmac_toggle_energy(cycles=300, seed=1, acc="fp32", liberty=LIBERTY_PATH, netlist=None) -> dict:
    """pJ per operation of the FPMAC (FP16 x FP16 + accumulator) from its mapped netlist's switching: one
    operation per cycle, a, b ~ N(0, 1) rounded to FP16, c ~ N(0, 1) in the accumulator format; the first
    ``latency`` + 2 cycles (reset, pipeline fill) are not counted. The netlist's results are checked against
    NumPy (``acc="fp32"``: the FP16 product is exact in FP32, then one FP32 add rounds to nearest even): a
    mismatch is an error, so the simulated netlist is the working MAC. ``netlist``: an already mapped
    :func:`mapped_netlist` of the same FPMAC (default: map it here)."""
    from hdl.fp import FPMAC
    if not 10 <= cycles <= 100_000:
        raise ValueError(f"cycles must be in 10 .. 100000, got {cycles}")
    if acc not in ("fp16", "fp32"):
        raise ValueError(f"acc must be one of ['fp16', 'fp32'], got {acc!r}")
    sim = GateSim(netlist or mapped_netlist("fpmac", FPMAC(acc=acc), liberty), liberty)
    rng = np.random.default_rng(seed)
    w = 32 if acc == "fp32" else 16
    cbits = _f32_bits if w == 32 else _f16_bits
    sim.set_port("rst", 1)
    sim.set_port("i__valid", 0)
    sim.set_port("o__ready", 1)
    for _ in range(2):
        sim.step(count=False)
    sim.set_port("rst", 0)
    sim.set_port("i__valid", 1)
    skip = FPMAC.latency + 2
    expect, checked = [], 0
    for t in range(cycles + skip):
        a, b, c = rng.standard_normal(3)
        sim.set_port("i__payload", _f16_bits(a) | (_f16_bits(b) << 16) | (cbits(c) << 32))
        if acc == "fp32":
            p = np.float32(np.float16(a)) * np.float32(np.float16(b))
            expect.append(_f32_bits(np.float32(p + np.float32(c))))
        sim.step(count=t >= skip)
        if acc == "fp32" and sim.get_port("o__valid"):
            z = sim.get_port("o__payload") & 0xFFFFFFFF
            if z != expect[checked]:
                raise AssertionError(f"gate-level FPMAC result {checked}: {z:#010x} != {expect[checked]:#010x}")
            checked += 1
    pj = sim.energy_fj / sim.cycles / 1000.0
    flops = sum(1 for _t, _i, _o, _c in sim.flops)
    clk_pj = sum(CELL_FJ[t][1] for t, _i, _o, _c in sim.flops) / 1000.0
    return {"pj_per_op": pj, "clock_pins_pj": clk_pj, "logic_pj": pj - clk_pj, "cycles": sim.cycles,
            "flops": flops, "cells": len(sim.comb) + flops, "toggles_per_cycle": sum(sim.toggles.values()) / sim.cycles,
            "vdd": VDD, "pj_per_op_at_0v9": pj * (0.9 / VDD) ** 2, "acc": acc, "results_checked": checked}
