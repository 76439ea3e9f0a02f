"""Command traces: records of the commands a controller put on a channel's command bus.

A hardware trace record is one ``trace_layout(org)`` value (see :mod:`hdl.memctl.commands`), captured as a
plain int. :func:`decode_trace` turns those ints into :class:`TraceCommand` objects using the layout's own field
offsets and widths, so it follows any change of the layout; :func:`encode_trace` is its inverse (for tests).
"""

from dataclasses import dataclass

from amaranth.hdl import Shape
from amaranth.lib import data

from hdl.memctl.commands import Cmd, trace_layout

__all__ = ["TraceCommand", "decode_trace", "encode_trace"]


@dataclass(frozen=True, slots=True)
class TraceCommand:
    cycle: int
    kind: Cmd
    rank: int = 0
    bg: int = 0
    bank: int = 0
    row: int = 0
    col: int = 0  # burst index within the row (0 .. org.bursts_per_row - 1)

    def __str__(self):
        k = self.kind
        if k in (Cmd.PREA, Cmd.REF):
            where = f"rank{self.rank}"
        elif k is Cmd.ACT_AB:
            where = f"rank{self.rank} row{self.row}"
        elif k in (Cmd.RD_AB, Cmd.WR_AB):
            where = f"rank{self.rank} col{self.col}"
        elif k is Cmd.ACT:
            where = f"rank{self.rank} bg{self.bg} bank{self.bank} row{self.row}"
        elif k in (Cmd.RD, Cmd.WR):
            where = f"rank{self.rank} bg{self.bg} bank{self.bank} col{self.col}"
        elif k is Cmd.PRE:
            where = f"rank{self.rank} bg{self.bg} bank{self.bank}"
        else:
            where = ""
        return f"{k.name} {where}".rstrip()


_FIELDS = ("rank", "bg", "bank", "row", "col")


def _offsets(org):
    """(offset, mask) of the kind, each address field and the cycle inside a trace_layout(org) int."""
    layout = trace_layout(org)
    cmd_field = layout["cmd"]
    cmd_layout = data.Layout.cast(cmd_field.shape)
    base = cmd_field.offset

    def om(f, base=0):
        return base + f.offset, (1 << Shape.cast(f.shape).width) - 1

    kind = om(cmd_layout["kind"], base)
    addr = [om(cmd_layout[name], base) for name in _FIELDS]
    cycle = om(layout["cycle"])
    return kind, addr, cycle


def decode_trace(payloads, org) -> list[TraceCommand]:
    """Decode raw ``trace_layout(org)`` payload ints into commands (in the given order)."""
    (k_off, k_mask), addr, (c_off, c_mask) = _offsets(org)
    (r_off, r_m), (g_off, g_m), (b_off, b_m), (w_off, w_m), (l_off, l_m) = addr
    by_value = {c.value: c for c in Cmd}
    out = []
    append = out.append
    for p in payloads:
        p = int(p)
        code = (p >> k_off) & k_mask
        kind = by_value.get(code)
        if kind is None:
            raise ValueError(f"trace record {len(out)}: unknown command code {code} in payload {p:#x}")
        append(TraceCommand((p >> c_off) & c_mask, kind, (p >> r_off) & r_m, (p >> g_off) & g_m,
                            (p >> b_off) & b_m, (p >> w_off) & w_m, (p >> l_off) & l_m))
    return out


def encode_trace(commands, org) -> list[int]:
    """Inverse of :func:`decode_trace`: pack commands into ``trace_layout(org)`` payload ints."""
    (k_off, k_mask), addr, (c_off, c_mask) = _offsets(org)
    out = []
    for i, c in enumerate(commands):
        values = (c.rank, c.bg, c.bank, c.row, c.col)
        p = (c.kind.value & k_mask) << k_off
        for (off, mask), name, v in zip(addr, _FIELDS, values):
            if not 0 <= v <= mask:
                raise ValueError(f"command {i} ({c}): {name}={v} does not fit the {mask.bit_length()}-bit field")
            p |= v << off
        if not 0 <= c.cycle <= c_mask:
            raise ValueError(f"command {i} ({c}): cycle {c.cycle} does not fit the trace's cycle field")
        p |= c.cycle << c_off
        out.append(p)
    return out
