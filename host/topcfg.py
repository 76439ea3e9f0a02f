"""Every Verilog top at any validated configuration: the catalogue behind ``ndpim verilog --top T --preset P
[--set FIELD=VALUE ...]``, ``ndpim verilog --list`` and the port page ``docs/ports.md`` (``ndpim ports``).

A :class:`TopSpec` names a top (the names of :data:`hdl.tops.TOPS`), its configuration presets -- frozen, validated
dataclasses: :class:`hdl.ndp.config.NDPConfig`, :class:`hdl.pim.config.PIMConfig`,
:class:`hdl.memctl.timing.DRAMConfig`, or a small parameter record for tops built from keyword arguments -- and
how to build the component from one. ``--set`` replaces fields by dotted path (``lanes=16``, ``ndp.lanes=16``,
``dram.org.rows=1024``); the value is parsed as the field's current type and the configuration is validated
again (its own checks name the field and the allowed range). A top of :data:`hdl.tops.TOPS` this catalogue does
not know is listed with its fixed configuration (preset ``default``, nothing to set).
"""

import dataclasses
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass, replace
from typing import Callable

__all__ = ["TopSpec", "catalogue", "get_spec", "configure", "parse_sets", "describe", "port_table",
           "ports_markdown"]


@dataclass(frozen=True)
class TopSpec:
    name: str
    doc: str
    presets: dict
    default: str
    build: Callable = field(repr=False)

    def config(self, preset: str | None = None):
        p = preset or self.default
        try:
            return self.presets[p]
        except KeyError:
            raise ValueError(f"top {self.name!r} has no preset {p!r}; presets: {sorted(self.presets)}") from None


def _params(name, choices=None, **defaults):
    """A parameter record of a top built from keyword arguments; ``choices``: {field: allowed values}, checked on
    construction (the component's own constructor checks the rest when ``configure`` builds it)."""
    choices = dict(choices or {})

    def check(self):
        for k, allowed in choices.items():
            if getattr(self, k) not in allowed:
                raise ValueError(f"{k} must be one of {sorted(allowed)}, got {getattr(self, k)!r}")
    cls = make_dataclass(name, [(k, type(v), field(default=v)) for k, v in defaults.items()], frozen=True,
                         kw_only=True, namespace={"__post_init__": check})
    return cls()


def catalogue() -> dict:
    """name -> :class:`TopSpec` for every top of :data:`hdl.tops.TOPS`."""
    from hdl import tops as T
    from hdl.fp import FP16, FP32, FPMul, FPAdd, FPMAC
    from hdl.memctl.controller import MemoryController
    from hdl.memctl.timing import DDR4_3200, LPDDR5X_8533
    from hdl.memctl.addrmap import AddressMap
    from hdl.memctl.devmem import GRANULE_BYTES
    from amaranth.utils import exact_log2
    from hdl.ndp.config import TINY as NDP_TINY, PAPER as NDP_PAPER
    from hdl.ndp.decoder import DescriptorDecoder
    from hdl.ndp.pe_array import PEArray
    from hdl.ndp.softmax import SoftmaxUnit
    from hdl.ndp.core import NDPCore
    from hdl.cxl import CSRBank, RegisterMap
    from hdl.cxl.guard import MemoryGuard
    from hdl.cxl.device import CXLDevice
    from hdl.cxl.filter import HostFilter
    from hdl.cxl.regmap import QueueLayout
    from hdl.pim.config import PAPER as PIM_PAPER, TINY as PIM_TINY
    from hdl.pim.bank_pu import BankPU
    from hdl.pim.relayout import Relayout
    from hdl.pim.adder_unit import AdderUnit
    from hdl.pim.softmax_unit import PIMSoftmaxUnit, PIMNormalizer
    from hdl.pim.rank_pu import RankPU, PIMSequencer

    fmts = {"fp16": FP16, "fp32": FP32}
    _fmt_choices = {"fmt": fmts, "out_fmt": fmts}

    def _ndp_core(c):
        if not hasattr(c, "channels"):          # on a memory controller's bursts
            return NDPCore(config=c.ndp, mem_burst_bits=c.dram.org.burst_bits, mem_addr_bits=addr(c.dram),
                           mem_tag_width=c.tag_width)
        # on the device memory's NDP port (hdl/memctl/devmem.py DeviceMemory: line_bits, ndp_addr_bits)
        line_bytes = GRANULE_BYTES * c.channels
        if line_bytes != c.ndp.align_bytes:
            raise ValueError(f"the line of {c.channels} channels ({line_bytes} B) must equal ndp.align_bytes "
                             f"({c.ndp.align_bytes} B)")
        sub_bits = exact_log2(GRANULE_BYTES // c.dram.org.burst_bytes)
        return NDPCore(config=c.ndp, mem_burst_bits=8 * line_bytes, mem_addr_bits=addr(c.dram) - sub_bits,
                       mem_tag_width=c.tag_width)
    addr = lambda dram: AddressMap(dram.org).addr_bits  # noqa: E731
    specs = [
        TopSpec("fp16_mul", "FP16 multiplier", {"default": _params("FPMulParams", _fmt_choices, fmt="fp16", out_fmt="fp16")},
                "default", lambda c: FPMul(fmt=fmts[c.fmt], out_fmt=fmts[c.out_fmt])),
        TopSpec("fp16_mul_fp32", "FP16 x FP16 -> FP32 multiplier",
                {"default": _params("FPMulParams", _fmt_choices, fmt="fp16", out_fmt="fp32")}, "default",
                lambda c: FPMul(fmt=fmts[c.fmt], out_fmt=fmts[c.out_fmt])),
        TopSpec("fp16_add", "FP16 adder", {"default": _params("FPAddParams", {"fmt": fmts}, fmt="fp16")}, "default",
                lambda c: FPAdd(fmt=fmts[c.fmt])),
        TopSpec("fp32_add", "FP32 adder", {"default": _params("FPAddParams", {"fmt": fmts}, fmt="fp32")}, "default",
                lambda c: FPAdd(fmt=fmts[c.fmt])),
        TopSpec("fp16_mac_fp16", "FP16 multiply-accumulate, FP16 accumulator",
                {"default": _params("FPMACParams", {"acc": fmts}, acc="fp16")}, "default", lambda c: FPMAC(acc=c.acc)),
        TopSpec("fp16_mac_fp32", "FP16 multiply-accumulate, FP32 accumulator",
                {"default": _params("FPMACParams", {"acc": fmts}, acc="fp32")}, "default", lambda c: FPMAC(acc=c.acc)),
        TopSpec("memctl_ddr4_3200", "memory controller (FR-FCFS, refresh) on a DRAM timing set",
                {"ddr4-3200": DDR4_3200, "lpddr5x-8533": LPDDR5X_8533}, "ddr4-3200",
                lambda c: MemoryController(config=c)),
        TopSpec("memctl_lpddr5x_8533", "memory controller (FR-FCFS, refresh) on a DRAM timing set",
                {"lpddr5x-8533": LPDDR5X_8533, "ddr4-3200": DDR4_3200}, "lpddr5x-8533",
                lambda c: MemoryController(config=c)),
        TopSpec("ndp_decoder", "NDP descriptor decoder (instruction buffer + checks)",
                {"paper": NDP_PAPER, "tiny": NDP_TINY}, "paper", lambda c: DescriptorDecoder(config=c)),
        TopSpec("ndp_pe_array", "NDP GEMV/GEMM PE array of FPMACs",
                {"default": _params("PEArrayParams", lanes=4, batch=4, acc="fp32", max_k=4096, acc_columns=16)},
                "default", lambda c: PEArray(lanes=c.lanes, batch=c.batch, acc=c.acc, max_k=c.max_k,
                                  acc_columns=c.acc_columns)),
        TopSpec("ndp_softmax", "NDP softmax SFU",
                {"default": _params("SoftmaxParams", lanes=8, max_len=1024, max_rows=128)}, "default",
                lambda c: SoftmaxUnit(lanes=c.lanes, max_len=c.max_len, max_rows=c.max_rows)),
        TopSpec("ndp_core", "NDP core (decoder, control, buffers, PE array, SFU) on a memory controller's bursts",
                {"tiny": _params("NDPCoreParams", ndp=NDP_TINY, dram=DDR4_3200, tag_width=8),
                 # the paper core on the 64-channel LPDDR5X device memory's wide port (sim/ndp/system.py
                 # NDPDeviceSystem): one line = a 64-byte granule of every channel = PAPER.align_bytes (4096 B),
                 # line addresses of the 512 GiB device (27 bits), the device memory's default 8-bit NDP tag
                 "paper": _params("NDPCoreDevmemParams", ndp=NDP_PAPER, dram=LPDDR5X_8533, channels=64,
                                  tag_width=8)}, "tiny",
                _ndp_core),
        TopSpec("cxl_csr", "CXL.io register bank of the device's requester queues",
                {"tiny": _params("CSRParams", num_queues=4, ndp=NDP_TINY)}, "tiny",
                lambda c: CSRBank(RegisterMap(num_queues=c.num_queues), layout=QueueLayout.for_config(c.ndp))),
        TopSpec("cxl_filter", "host CXL.mem address filter (queue window + PASID)",
                {"tiny": _params("FilterParams", num_queues=4, ndp=NDP_TINY, dram=DDR4_3200)}, "tiny",
                lambda c: HostFilter(c.num_queues, addr(c.dram), QueueLayout.for_config(c.ndp))),
        TopSpec("cxl_guard", "per-queue address window guard on the core's memory requests",
                {"ddr4-3200": _params("GuardParams", dram=DDR4_3200, tag_width=8)}, "ddr4-3200",
                lambda c: MemoryGuard(addr_bits=addr(c.dram), burst_bytes=c.dram.org.burst_bits // 8,
                                      tag_width=c.tag_width)),
        TopSpec("cxl_device", "the CXL NDP device: CSR bank, queue engine, guard, arbiter, NDP core",
                {"tiny": _params("CXLDeviceParams", ndp=NDP_TINY, num_queues=4, dram=DDR4_3200, tag_width=8)},
                "tiny", lambda c: CXLDevice(config=c.ndp, num_queues=c.num_queues, mem_addr_bits=addr(c.dram),
                                            mem_tag_width=c.tag_width)),
    ]
    pim = {"paper": PIM_PAPER, "tiny": PIM_TINY}
    for name, doc, build in (
            ("pim_bank_pu", "DIMM-PIM bank PU (4 FP16 multipliers + 4 adders)", lambda c: BankPU(c)),
            ("pim_relayout", "rank PU re-layout double buffer", lambda c: Relayout(c)),
            ("pim_adder_unit", "rank PU adder unit", lambda c: AdderUnit(c)),
            ("pim_softmax", "rank PU chunk softmax unit", lambda c: PIMSoftmaxUnit(c)),
            ("pim_normalizer", "rank PU normalizer", lambda c: PIMNormalizer(c)),
            ("pim_rank_pu", "rank PU: sequencer, bank-PU routing, adder / softmax units, normalizer, buffer",
             lambda c: RankPU(c)),
            ("pim_rank_pu_seq", "rank PU sequencer (all-bank command program, refresh)",
             lambda c: PIMSequencer(c))):
        specs.append(TopSpec(name, doc, pim, "paper", build))
    out = {s.name: s for s in specs if s.name in T.TOPS}
    for name, factory in T.TOPS.items():            # tops this catalogue does not know: fixed configuration
        if name not in out:
            out[name] = TopSpec(name, (factory.__doc__ or "").strip() or "(fixed configuration)",
                                {"default": _params("Fixed")}, "default", lambda c, f=factory: f())
    return out


def get_spec(name: str) -> TopSpec:
    cat = catalogue()
    try:
        return cat[name]
    except KeyError:
        raise ValueError(f"unknown top {name!r}; allowed: {sorted(cat)}") from None


def _parse(value: str, current):
    if isinstance(current, bool):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {value!r}")
    if isinstance(current, int):
        try:
            return int(value, 0)
        except ValueError:
            raise ValueError(f"expected an integer, got {value!r}") from None
    if isinstance(current, float):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    if isinstance(current, str):
        return value
    raise ValueError(f"cannot set a field of type {type(current).__name__} from the command line")


def _apply(obj, tree, where=""):
    """Replace the fields named in ``tree`` ({field: value str or subtree}) at once, then validate."""
    if not is_dataclass(obj):
        raise ValueError(f"{where or 'the configuration'} ({type(obj).__name__}) has no fields to set")
    names = [f.name for f in fields(obj)]
    new = {}
    for k, v in tree.items():
        if k not in names:
            raise ValueError(f"{type(obj).__name__} has no field {where + k!r}; fields: {names}")
        cur = getattr(obj, k)
        if isinstance(v, dict):
            new[k] = _apply(cur, v, f"{where}{k}.")
            continue
        try:
            new[k] = _parse(v, cur)
        except ValueError as exc:
            raise ValueError(f"{where}{k}={v}: {exc}") from None
    try:
        return replace(obj, **new)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{', '.join(f'{where}{k}' for k in new)}: {exc}") from None


def parse_sets(items) -> list:
    out = []
    for it in items or ():
        k, sep, v = it.partition("=")
        if not sep or not k:
            raise ValueError(f"expected FIELD=VALUE, got {it!r}")
        out.append((k.strip(), v.strip()))
    return out


def configure(name: str, preset: str | None = None, sets=()) -> tuple:
    """``(spec, config)``: the preset with ``sets`` (``[(path, value)]``) applied and validated."""
    spec = get_spec(name)
    cfg = spec.config(preset)
    tree = {}
    for path, value in sets:
        node, parts = tree, path.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {path}: {p} is set as a value and as a configuration")
        node[parts[-1]] = value
    if tree:
        cfg = _apply(cfg, tree)
        try:                # the component's constructor checks what the record cannot (cheap: no elaboration)
            comp = spec.build(cfg)
        except (ValueError, KeyError, TypeError) as exc:
            tb = exc.__traceback__
            while tb is not None:       # what the failed constructor had made: no UnusedElaboratable warnings
                for v in tb.tb_frame.f_locals.values():
                    silence(v)
                tb = tb.tb_next
            raise ValueError(", ".join(f"{p}={v}" for p, v in sets) + f": {exc}") from None
        silence(comp)
    return spec, cfg


def _leaves(obj, prefix=""):
    for f in fields(obj):
        v = getattr(obj, f.name)
        if is_dataclass(v):
            yield from _leaves(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", v


def describe(config, *, limit: int = 0) -> str:
    """``field=value`` of every leaf of a configuration (the ``name`` fields of nested configs shortened)."""
    parts = []
    for k, v in _leaves(config) if is_dataclass(config) else ():
        if k == "name" or k.endswith(".name"):
            continue
        parts.append(f"{k}={v}")
    if limit and len(parts) > limit:
        parts = parts[:limit] + [f"... ({len(parts) - limit} more)"]
    return " ".join(parts)


def port_table(component) -> list:
    """``[(port, direction, width, [(field, lo, hi)])]`` of a component's signature: stream ports' payload
    fields with their bit ranges ``[lo, hi)`` in ``<port>__payload`` (flattened: ``a.b``), other ports' widths."""
    from amaranth.hdl import Shape
    from amaranth.lib import stream, data, wiring

    def flat(layout, base, prefix):
        out = []
        if isinstance(layout, data.ArrayLayout):
            w = Shape.cast(layout.elem_shape).width
            if isinstance(layout.elem_shape, data.StructLayout) and layout.length <= 4:
                for i in range(layout.length):
                    out += flat(layout.elem_shape, base + i * w, f"{prefix}[{i}].")
            else:
                out.append((f"{prefix}[0..{layout.length})" if prefix else f"[0..{layout.length})",
                            base, base + layout.length * w))
            return out
        if isinstance(layout, data.StructLayout):
            for fname, f in layout:
                sub = f.shape
                if isinstance(sub, (data.StructLayout, data.ArrayLayout)):
                    out += flat(sub, base + f.offset, f"{prefix}{fname}.")
                else:
                    w = Shape.cast(sub).width
                    out.append((f"{prefix}{fname}", base + f.offset, base + f.offset + w))
        return out

    rows = []
    for name, member in component.signature.members.items():
        direction = "in" if member.flow == wiring.In else "out"
        if member.is_signature and isinstance(member.signature, stream.Signature):
            shape = member.signature.members["payload"].shape
            w = Shape.cast(shape).width
            rows.append((name, direction + " stream", w, flat(shape, 0, "")))
        elif member.is_signature:
            rows.append((name, direction + " interface", None, []))
        else:
            rows.append((name, direction, Shape.cast(member.shape).width, flat(member.shape, 0, "")))
    return rows


from sim.e2e.design_cache import silence  # noqa: E402  (re-exported)


def ports_markdown(names=None) -> str:
    """The generated port page: every top at its default preset."""
    cat = catalogue()
    lines = ["# Port bit layouts of the Verilog tops", "",
             "Generated by `ndpim ports --out docs/ports.md` from each top's Amaranth signature at its default "
             "preset (`ndpim verilog --list` shows the presets; other configurations change widths, not the "
             "order). In Verilog a stream port `p` is `p__valid`, `p__ready` and `p__payload`; a payload field "
             "`[lo, hi)` is `p__payload[hi-1:lo]`. Every top also has `clk` and a synchronous active-high `rst`.",
             ""]
    for name in names or sorted(cat):
        spec = cat[name]
        cfg = spec.config()
        try:
            comp = spec.build(cfg)
            rows = port_table(comp)
            silence(comp)
        except Exception as exc:            # noqa: BLE001 - a top that cannot be built here is named, not hidden
            lines += [f"## {name}", "", f"(not built: {exc})", ""]
            continue
        lines += [f"## `{name}`", "", f"{spec.doc}. Preset `{spec.default}`"
                  + (f": {describe(cfg, limit=12)}" if describe(cfg) else "") + ".", "",
                  "| port | direction | bits | payload fields `[lo, hi)` |", "|---|---|---|---|"]
        for port, direction, w, flds in rows:
            f = ", ".join(f"`{n}` [{lo}, {hi})" for n, lo, hi in flds) if flds else ""
            if len(flds) > 24:
                f = ", ".join(f"`{n}` [{lo}, {hi})" for n, lo, hi in flds[:24]) + f", ... ({len(flds)} fields)"
            lines.append(f"| `{port}` | {direction} | {'' if w is None else w} | {f} |")
        lines.append("")
        silence(comp)
    return "\n".join(lines) + "\n"
