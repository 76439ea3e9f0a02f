"""Synthesis cell counts per distinct module x instance count (``ndpim synth --mode hier``).

A flat synthesis of the paper-geometry NDP core (1024 FPMACs, a 512-lane datapath, 3 MiB of buffers) is far too
slow: even its flat RTLIL takes many minutes to generate. Instead, every instance of a *unit* class (by default
the FP units of :mod:`hdl.fp`, the NDP core's PE array, softmax unit and decoder, the device memory's
:class:`hdl.memctl.devmem.DeviceChannel`) is replaced by a black-box instance while the design is elaborated, so
each distinct unit is elaborated, converted and synthesized once:

* two instances are the same *distinct module* when they have the same class, the same parameters (their
  int / str / bool / float / dataclass attributes) and the same signature (:func:`_key`);
  :func:`hier_cells` ``(verify=True)`` converts every instance and checks that their RTLIL is identical;
* a unit inside an :class:`amaranth.hdl.EnableInserter` (the NDP core's 15-of-16 clock enable) becomes the
  *gated* variant ``<name>_en``: the module synthesized with an ``en`` input on its ``sync`` domain, the
  instance's ``en`` wired to the inserter's control;
* each distinct module is synthesized flat (``synth -flatten``) with its own unit children as black boxes;
  memories are **not** mapped to flip-flops (no ``memory_map``): they stay ``$mem_v2`` cells (SRAM macros),
  reported with their bits;
* instance counts come from the elaborated fragment trees and are checked against the black-box cells Yosys
  counts in every module (:func:`check_counts`); total = sum over distinct modules of count x own cells.

The figures are Yosys generic gates (``$_AND_``, ``$_MUX_``, ``$_DFF_P_`` ...), not a technology library.
Only :class:`amaranth.hdl.EnableInserter` is supported above a unit (a ``ResetInserter`` there is an error).
"""

import dataclasses
import json
import re
import subprocess
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

from amaranth.back import rtlil
from amaranth.hdl import Elaboratable, Signal, Shape, ClockSignal, ResetSignal, Instance, EnableInserter, ResetInserter
from amaranth.hdl._mem import MemoryInstance
from amaranth.hdl._ir import Fragment, PortDirection
from amaranth.lib import wiring

from sim.synth.yosys import _yosys

__all__ = ["hier_cells", "hier_verilog", "elaborate_distinct", "flat_cells", "check_counts", "default_units", "format_report", "SYNTH_NOMAP"]

#: ``synth`` (Yosys 0.70 ``help synth``) without its ``memory_map`` step: memories stay ``$mem_v2`` macros, the
#: rest is mapped to generic gates exactly as ``synth`` does (fine: opt -fast -full, opt -full, techmap,
#: opt -fast, abc, opt -fast).
SYNTH_NOMAP = ("synth -flatten -top {top} -run begin:fine; opt -fast -full; opt -full; techmap; opt -fast; abc; "
               "opt -fast; hierarchy -check")


def default_units():
    """The unit classes black-boxed by default: the FP units, the NDP core's big blocks, the device channel."""
    from hdl.fp import FPAdd, FPMul, FPMAC
    from hdl.fp.convert import FPConvert
    from hdl.fp.div import FPDiv
    from hdl.fp.exp import FPExp
    from hdl.fp.max import FPMax
    from hdl.ndp.pe_array import PEArray
    from hdl.ndp.softmax import SoftmaxUnit
    from hdl.ndp.decoder import DescriptorDecoder
    from hdl.memctl.devmem import DeviceChannel
    return (FPAdd, FPMul, FPMAC, FPConvert, FPDiv, FPExp, FPMax, PEArray, SoftmaxUnit, DescriptorDecoder,
            DeviceChannel)


def _param(v):
    if isinstance(v, (bool, int, str, float, type(None))):
        return True
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return True
    if isinstance(v, tuple):
        return all(_param(x) for x in v)
    return False


def _key(obj):
    """What makes two unit instances the same module: class, parameters, signature."""
    params = tuple(sorted((k, repr(v)) for k, v in vars(obj).items() if not k.startswith("_") and _param(v)))
    return (type(obj).__module__, type(obj).__qualname__, params, repr(obj.signature))


def _ports(component):
    """``{name: (value, direction)}`` of a component's signature, as Amaranth names a top's ports."""
    out = {}
    for path, member, value in component.signature.flatten(component):
        name = "__".join(map(str, path))
        out[name] = (value.as_value() if hasattr(value, "as_value") else value,
                     "i" if member.flow == wiring.In else "o")
    return out


class _Registry:
    def __init__(self, units, verify):
        self.units = tuple(units)
        self.verify = verify
        self.names = {}             # key -> base name
        self.reps = {}              # base name -> representative component
        self.instances = {}         # base name -> every instance (verify only)
        self.gated = set()          # names of gated variants (base + "_en")
        self.top = None

    def name_of(self, obj):
        key = _key(obj)
        if key not in self.names:
            n = sum(1 for k in self.names if k[1] == key[1])
            name = f"{type(obj).__name__}_{n}"
            self.names[key] = name
            self.reps[name] = obj
            self.instances[name] = []
        name = self.names[key]
        if self.verify:
            self.instances[name].append(obj)
        return name

    def all_names(self):
        return set(self.reps) | self.gated


@contextmanager
def _black_boxes(reg):
    """While active, every instance of ``reg.units`` (other than ``reg.top``) elaborates to a black box."""
    orig_get = Fragment.__dict__["get"]
    orig_en = EnableInserter.on_fragment
    orig_rst = ResetInserter.on_fragment
    get = orig_get.__func__ if isinstance(orig_get, staticmethod) else orig_get

    def patched_get(obj, platform):
        if obj is not reg.top and isinstance(obj, reg.units) and isinstance(obj, wiring.Component):
            name = reg.name_of(obj)
            obj._MustUse__silence = True                 # elaborated separately (its representative)
            for v in vars(obj).values():
                if isinstance(v, Elaboratable):
                    v._MustUse__silence = True
            kw = {"i_clk": ClockSignal("sync"), "i_rst": ResetSignal("sync")}
            for pname, (value, d) in _ports(obj).items():
                kw[f"{d}_{pname}"] = value
            return get(Instance(name, **kw), platform)
        return get(obj, platform)

    def patched_en(self, fragment):
        new = orig_en(self, fragment)
        if isinstance(new, Instance) and new.type in reg.all_names() and "sync" in self.controls:
            ctl = self.controls["sync"]
            if new.type in reg.gated:
                new.ports["en"] = (new.ports["en"][0] & ctl, "i")
            else:
                new.type += "_en"
                reg.gated.add(new.type)
                new.ports["en"] = (ctl, "i")
        return new

    def patched_rst(self, fragment):
        if isinstance(fragment, Instance) and fragment.type in reg.all_names():
            raise ValueError(f"hierarchical synthesis: the unit {fragment.type} sits under a ResetInserter, which a "
                             f"black box cannot carry; synthesize this design flat (--mode full / fast)")
        return orig_rst(self, fragment)

    Fragment.get = staticmethod(patched_get)
    EnableInserter.on_fragment = patched_en
    ResetInserter.on_fragment = patched_rst
    try:
        yield
    finally:
        Fragment.get = orig_get
        EnableInserter.on_fragment = orig_en
        ResetInserter.on_fragment = orig_rst


def _walk(fragment, names, counts, stubs, mems=None, path=""):
    for sub, name, _loc in fragment.subfragments:
        if isinstance(sub, Instance) and sub.type in names:
            counts[sub.type] += 1
            stubs.setdefault(sub.type, {k: (len(v), d) for k, (v, d) in sub.ports.items()})
        elif isinstance(sub, MemoryInstance):
            if mems is not None:
                mems[path + str(name)] = Shape.cast(sub._data.shape).width * sub._data.depth
        else:
            _walk(sub, names, counts, stubs, mems, f"{path}{name}.")


def _convert(reg, name, component, gated, counts_only=False):
    """RTLIL of one module (its units black boxes; None with ``counts_only``: elaborated, not converted); its unit
    children ``Counter``, their port widths and ``{memory path: bits}``."""
    ports = {k: (v, PortDirection.Input if d == "i" else PortDirection.Output)
             for k, (v, d) in _ports(component).items()}
    elab = component
    if gated:
        en = Signal(name="en")
        elab = EnableInserter({"sync": en})(component)
        ports["en"] = (en, PortDirection.Input)
    reg.top = component
    with _black_boxes(reg):
        frag = Fragment.get(elab, None)
    counts, stubs, mems = Counter(), {}, {}
    _walk(frag, reg.all_names(), counts, stubs, mems)
    if counts_only:
        return None, counts, stubs, mems
    text, _ = rtlil.convert_fragment(frag, ports, name, emit_src=False)
    return text, counts, stubs, mems


def _stub(name, ports):
    def esc(s):
        return s if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s) else f"\\{s} "
    decl = ", ".join(f"{'input' if d == 'i' else 'output'} [{w - 1}:0] {esc(p)}" for p, (w, d) in ports.items())
    return f"(* blackbox *)\nmodule {name}({decl});\nendmodule\n"


_STAT_CELL = re.compile(r"^\s+(\d+)\s+(\S+)\s*$", re.M)


def _stat(report):
    """``({cell type: count}, memories, memory bits)`` of a ``stat`` report (Yosys 0.70 and older formats)."""
    by_type = {k: int(n) for n, k in _STAT_CELL.findall(report) if not k.endswith(":")}
    mems = re.search(r"(\d+)\s+memories|Number of memories:\s+(\d+)", report)
    bits = re.search(r"(\d+)\s+memory bits|Number of memory bits:\s+(\d+)", report)
    val = (lambda m: int(m.group(1) or m.group(2)) if m else 0)
    by_type.pop("$scopeinfo", None)
    return {k: v for k, v in by_type.items() if not k[0].isdigit()}, val(mems), val(bits)


def _yosys_run(tmp, script):
    out = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True, cwd=tmp)
    if out.returncode:
        raise RuntimeError(f"yosys failed:\n{(out.stdout + out.stderr)[-3000:]}")
    return (Path(tmp) / "stat.txt").read_text()


def _summary(by_type):
    cells = {k: v for k, v in by_type.items() if k.startswith("$")}
    return {"cells": sum(v for k, v in cells.items() if k != "$mem_v2"),
            "flops": sum(v for k, v in cells.items() if "DFF" in k.upper()),
            "memories": cells.get("$mem_v2", 0), "by_type": cells}


def elaborate_distinct(name, component, *, units=None, verify=False, progress=None, counts_only=()):
    """Elaborate and convert every distinct module of ``component`` once (its units black boxes).

    Returns ``(texts, modules, stubs)``: ``{module: RTLIL}`` (the top first), ``{module: {"children", "class",
    "memory_bits", "convert_s"}}`` and ``{module: {port: (width, dir)}}`` of the black-box ports."""
    say = progress or (lambda s: None)
    reg = _Registry(units or default_units(), verify)
    work = [(name, component, False)]
    texts, modules = {}, {}
    stubs = {}
    while work:
        mname, comp, gated = work.pop(0)
        t1 = time.perf_counter()
        skip = type(comp).__qualname__ in counts_only
        text, counts, st, mems = _convert(reg, mname, comp, gated, counts_only=skip)
        stubs.update(st)
        if text is not None:
            texts[mname] = text
        modules[mname] = {"children": dict(sorted(counts.items())), "class": type(comp).__qualname__,
                          "params": dict(_key(comp)[2]),
                          "memory_bits": mems, "synthesized": not skip, "convert_s": time.perf_counter() - t1}
        say(f"[{name}] {mname}: " + ("elaborated only (counts, memories)" if skip else
                                     f"RTLIL {len(text) / 1e6:.1f} MB") +
            f" in {time.perf_counter() - t1:.1f} s; children {dict(counts)}")
        for child in counts:
            if child not in modules and all(child != w[0] for w in work):
                base = child[:-3] if child in reg.gated else child
                work.append((child, reg.reps[base], child in reg.gated))
    if verify:
        _verify_identical(reg)
    return texts, modules, stubs


def hier_verilog(name, component, *, units=None, progress=None, counts_only=()) -> str:
    """Verilog of the whole design with every distinct module written once (``name`` the top; units as
    modules ``<Class>_<n>[_en]`` instantiated as often as the design has them): what Verilator lints."""
    from amaranth.back.verilog import _convert_rtlil_text
    texts, modules, stubs = elaborate_distinct(name, component, units=units, progress=progress,
                                               counts_only=counts_only)
    # modules not converted (counts_only) are written as black-box stubs
    missing = [m for m in modules if m not in texts]
    text = _convert_rtlil_text("\n".join(texts.values()))
    return text + "".join(_stub(m, stubs[m]) for m in missing if m in stubs)


def hier_cells(name, component, *, units=None, verify=False, progress=None, workdir=None, checkpoint=None,
               counts_only=()) -> dict:
    """Synthesize ``component`` per distinct module (module docstring). ``progress``: a callable taking a line.

    Returns ``{"top", "modules": {module: {"cells", "flops", "memories", "by_type", "memory_bits": {name: bits},
    "children": {module: n}, "instances", "seconds", "class"}}, "total": {"cells", "flops", "memory_bits",
    "memories"}, "seconds"}``. ``cells`` exclude memories (``$mem_v2``, counted in ``memories`` and
    ``memory_bits``) and black boxes; ``flops`` are flip-flop bits (generic ``$_*DFF*_`` cells)."""
    t0 = time.perf_counter()
    say = progress or (lambda s: None)
    texts, modules, stubs = elaborate_distinct(name, component, units=units, verify=verify, progress=say,
                                               counts_only=counts_only)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for mname, text in sorted(texts.items(), key=lambda kv: len(kv[1])):     # small modules first
            t1 = time.perf_counter()
            (Path(tmp) / f"{mname}.il").write_text(text)
            children = modules[mname]["children"]
            lib = "".join(_stub(c, stubs[c]) for c in children)
            (Path(tmp) / f"{mname}_bb.v").write_text(lib or "\n")
            script = (f"read_verilog -lib {mname}_bb.v; read_rtlil {mname}.il; "
                      + SYNTH_NOMAP.format(top=mname) + "; tee -q -o stat.txt stat")
            by_type, _mems, bits = _stat(_yosys_run(tmp, script))
            modules[mname].update(_summary(by_type))
            modules[mname]["memory_bits_synth"] = bits        # what Yosys kept (unused memories are removed)
            modules[mname]["yosys_children"] = {k: v for k, v in by_type.items() if k in children}
            modules[mname]["seconds"] = time.perf_counter() - t1 + modules[mname].pop("convert_s")
            say(f"[{name}] {mname}: {modules[mname]['cells']} cells, {modules[mname]['flops']} flops, "
                f"{modules[mname]['memories']} memories ({time.perf_counter() - t1:.1f} s yosys)")
            if checkpoint:                  # what is done so far, for a run stopped before the end
                Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
                Path(checkpoint).write_text(json.dumps(modules, indent=1, default=str))
    for mname, mod in modules.items():
        if not mod["synthesized"]:
            mod.update(cells=None, flops=None, memories=len(mod["memory_bits"]), by_type={},
                       yosys_children=mod["children"], seconds=mod.pop("convert_s"))
    _instances(name, modules)
    check_counts(modules)
    total = {"cells": 0, "flops": 0, "memories": 0, "memory_bits": 0}
    for mod in modules.values():
        n = mod["instances"]
        total["cells"] += n * (mod["cells"] or 0)
        total["flops"] += n * (mod["flops"] or 0)
        total["memories"] += n * mod["memories"]
        total["memory_bits"] += n * sum(mod["memory_bits"].values())
    return {"top": name, "modules": modules, "total": total, "seconds": time.perf_counter() - t0,
            "not_synthesized": sorted(m for m, v in modules.items() if not v["synthesized"])}


def _instances(top, modules):
    """Instance count of every module: 1 for the top, sum over parents of parent count x multiplicity."""
    order, seen = [], set()

    def visit(m):                       # post-order, then reversed: parents before children
        if m in seen:
            return
        seen.add(m)
        for c in modules[m]["children"]:
            visit(c)
        order.append(m)
    visit(top)
    for m in modules:
        modules[m]["instances"] = 0
    modules[top]["instances"] = 1
    for m in reversed(order):
        for c, n in modules[m]["children"].items():
            modules[c]["instances"] += modules[m]["instances"] * n


def check_counts(modules):
    """Every module's unit children (counted in the elaborated fragments) must equal the black-box cells Yosys
    counted in it after synthesis; ValueError names the first difference."""
    for m, mod in modules.items():
        if mod["children"] != mod["yosys_children"]:
            raise ValueError(f"module {m}: instance counts {mod['children']} differ from the black boxes Yosys "
                             f"counted {mod['yosys_children']}")


def _verify_identical(reg):
    """Every instance of a distinct module converts to the same RTLIL as its representative."""
    for base, insts in reg.instances.items():
        ref = None
        for obj in insts:
            sub = _Registry(reg.units, False)
            sub.names, sub.reps, sub.gated = dict(reg.names), dict(reg.reps), set(reg.gated)
            text, _, _, _ = _convert(sub, base, obj, False)
            if ref is None:
                ref = text
            elif text != ref:
                raise ValueError(f"two instances of {base} ({type(obj).__qualname__}) convert differently")


def flat_cells(name, component, *, keep=None) -> dict:
    """The reference: Amaranth's own hierarchical RTLIL of ``component`` (every instance its own module), then
    ``SYNTH_NOMAP`` flattening everything except the modules whose names match ``keep`` (a regex; those get
    ``keep_hierarchy``). Returns ``{"cells", "flops", "memories", "by_type"}`` summed over the hierarchy."""
    text = rtlil.convert(component, name=name, emit_src=False)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "top.il").write_text(text)
        keep_cmd = ""
        if keep:
            mods = [m for m in re.findall(r"^module \\(\S+)", text, re.M) if re.search(keep, m) and m != name]
            keep_cmd = "".join(f"setattr -mod -set keep_hierarchy 1 {_yname(m)}; " for m in mods)
        script = (f"read_rtlil top.il; hierarchy -top {name}; {keep_cmd}" + SYNTH_NOMAP.format(top=name)
                  + f"; tee -q -o stat.txt stat -top {name}")
        report = _yosys_run(tmp, script)
    if keep:                                         # the hierarchy total: the last block of the report
        report = report[report.rfind("design hierarchy"):]
    by_type, _m, _b = _stat(report)
    return _summary(by_type)


def _yname(m):
    return "\\" + m if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_$]*", m) else m


def format_report(res) -> str:
    """Text table of :func:`hier_cells` results (``res``: ``{"core": ..., "devmem": ..., "total": ...}``)."""
    lines = []
    for part in ("core", "devmem"):
        r = res.get(part)
        if not r:
            continue
        lines.append(f"{r['top']}: per distinct module x instances ({r['seconds']:.0f} s)")
        lines.append(f"  {'module':<26}{'class':<20}{'inst':>6}{'cells':>9}{'flops':>8}{'mem bits':>10}"
                     f"{'x inst cells':>14}{'s':>7}")
        for m, mod in sorted(r["modules"].items(), key=lambda kv: -kv[1]["instances"] * (kv[1]["cells"] or 0)):
            bits = sum(mod["memory_bits"].values())
            if mod["cells"] is None:
                lines.append(f"  {m:<26}{mod['class']:<20}{mod['instances']:>6}{'-':>9}{'-':>8}{bits:>10}"
                             f"{'not synthesized':>14}{mod['seconds']:>7.1f}")
                continue
            lines.append(f"  {m:<26}{mod['class']:<20}{mod['instances']:>6}{mod['cells']:>9}{mod['flops']:>8}"
                         f"{bits:>10}{mod['instances'] * mod['cells']:>14}{mod['seconds']:>7.1f}")
        t = r["total"]
        lines.append(f"  total: {t['cells']:,} cells, {t['flops']:,} flops, {t['memories']} memories, "
                     f"{t['memory_bits']:,} SRAM bits ({t['memory_bits'] / 8 / 2**20:.2f} MiB)")
        if r.get("not_synthesized"):
            lines.append(f"  not synthesized (elaborated for their instance counts and memories only; their own "
                         f"logic is missing from the cells): {', '.join(r['not_synthesized'])}")
    t = res["total"]
    lines.append(f"{res['top']} ({res.get('preset')}) total: {t['cells']:,} cells, {t['flops']:,} flops, "
                 f"{t['memory_bits']:,} SRAM bits; {res['seconds']:.0f} s (Yosys generic gates)")
    return "\n".join(lines)
