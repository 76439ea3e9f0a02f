"""Re-layout unit of the DIMM-PIM buffer chip ([L3] 4.1; docs/references.md) and its numpy golden model.

See ``docs/pim_relayout.md`` (bit exchange, double-buffer timing, spoofed SPD) and ``docs/pim.md`` ("Data
placement: Re-layout"), whose contract this follows exactly.

The bit exchange. A DDR4 write burst of one rank is 8 beats of ``C * 8`` bits (``C`` = ``config.chips`` x8 chips;
byte ``k`` of a beat travels on chip ``k``'s DQ pins). DDR moves two beats per command clock [JESD79-4: data on
both DQS edges]. The host's FP16 element ``i`` of a beat sits in bytes ``2i, 2i+1`` (so in two chips). For each
pair of consecutive beats ``A``, ``B`` (= the ``2C`` bytes ``in[0 .. 2C)`` of one pair, ``A`` first) the unit emits

    out beat 0 byte k = in[2k]        (low byte of pair element k)
    out beat 1 byte k = in[2k + 1]    (high byte of pair element k),     k = 0 .. C-1,

so pair element ``k`` (``A0..A(C/2-1), B0..B(C/2-1)``) lands whole in chip ``k``: a perfect byte unshuffle of the
pair. After a whole burst, chip ``c``'s 64-bit burst (its byte of beats 0..7) holds 4 whole FP16 elements,
element ``j`` = its bytes of beats ``2j, 2j+1`` = host element ``C*j + c`` of the burst.

Reads are not re-laid out (the PIM reads K/V with all-bank commands inside the DIMM; the host never reads KV
back): the host gets the stored (re-laid-out) bytes and undoes them with :func:`inverse_relayout_burst` if it
ever needs to.
"""

import numpy as np

from amaranth.hdl import Module, Signal, Cat, Mux
from amaranth.lib import wiring, stream
from amaranth.lib.wiring import In, Out

from .config import PIMConfig, FP16_BITS

__all__ = [
    "Relayout", "relayout_words", "inverse_relayout_words", "relayout_burst", "inverse_relayout_burst",
    "chip_burst", "chip_elements", "host_burst",
]


def _check(config):
    if not isinstance(config, PIMConfig):
        raise ValueError(f"config must be a PIMConfig, got {type(config).__name__}")
    org = config.dram.org
    pair = FP16_BITS // org.device_width  # beats that carry one FP16 element through one x8 chip
    if config.relayout_beats != pair:
        raise ValueError(f"PIMConfig {config.name!r}: relayout_beats = {config.relayout_beats}, must be "
                         f"{pair} (an FP16 element is {pair} bytes of one x8 chip)")
    if org.beats_per_clock % pair:
        raise ValueError(f"PIMConfig {config.name!r}: dram.org.beats_per_clock = {org.beats_per_clock} must be "
                         f"a multiple of relayout_beats = {pair} (whole beat pairs per command clock)")
    if org.burst_length % pair:
        raise ValueError(f"PIMConfig {config.name!r}: burst_length = {org.burst_length} must be a multiple of "
                         f"{pair}")


# ---- golden model -----------------------------------------------------------------------------------------------

def _to_bytes(values, nbytes):
    return np.frombuffer(b"".join(int(v).to_bytes(nbytes, "little") for v in values),
                         dtype=np.uint8).reshape(len(values), nbytes)


def _from_bytes(arr):
    return [int.from_bytes(row.tobytes(), "little") for row in arr]


def _exchange(arr, chips, inverse=False):
    """``arr``: (n, nbytes) uint8, nbytes a multiple of 2 * chips; per pair of beats (2 * chips bytes)."""
    n, nbytes = arr.shape
    pairs = arr.reshape(n, nbytes // (2 * chips), 2 * chips)
    out = np.empty_like(pairs)
    if inverse:
        out[..., 0::2] = pairs[..., :chips]
        out[..., 1::2] = pairs[..., chips:]
    else:
        out[..., :chips] = pairs[..., 0::2]
        out[..., chips:] = pairs[..., 1::2]
    return out.reshape(n, nbytes)


def relayout_words(words, config: PIMConfig) -> list[int]:
    """The unit's output for clock words ``words`` (ints of ``org.clock_bits``; beat b in bits
    ``[b * beat_bits, (b + 1) * beat_bits)``)."""
    _check(config)
    nbytes = config.dram.org.clock_bits // 8
    return _from_bytes(_exchange(_to_bytes(words, nbytes), config.chips))


def inverse_relayout_words(words, config: PIMConfig) -> list[int]:
    """Inverse of :func:`relayout_words` (a perfect byte shuffle per beat pair)."""
    _check(config)
    nbytes = config.dram.org.clock_bits // 8
    return _from_bytes(_exchange(_to_bytes(words, nbytes), config.chips, inverse=True))


def relayout_burst(burst: int, config: PIMConfig) -> int:
    """What the DRAM stores for a host write burst ``burst`` (``org.burst_bits``, clock words LSB first)."""
    _check(config)
    return _from_bytes(_exchange(_to_bytes([burst], config.dram.org.burst_bytes), config.chips))[0]


def inverse_relayout_burst(stored: int, config: PIMConfig) -> int:
    """The host burst that was written, from the stored (re-laid-out) burst."""
    _check(config)
    return _from_bytes(_exchange(_to_bytes([stored], config.dram.org.burst_bytes), config.chips, inverse=True))[0]


def chip_burst(stored: int, config: PIMConfig, chip: int) -> int:
    """Chip ``chip``'s part of a stored burst: its byte of beats 0 .. burst_length - 1 (beat 0 in bits 0..7)."""
    org = config.dram.org
    if not 0 <= chip < config.chips:
        raise ValueError(f"chip = {chip} outside [0, {config.chips - 1}]")
    raw = _to_bytes([stored], org.burst_bytes)[0].reshape(org.burst_length, config.chips)
    return int.from_bytes(raw[:, chip].tobytes(), "little")


def chip_elements(stored: int, config: PIMConfig) -> np.ndarray:
    """(chips, burst_length / 2) uint16: element ``j`` of chip ``c`` = its bytes of beats ``2j`` (low), ``2j+1``."""
    org = config.dram.org
    raw = _to_bytes([stored], org.burst_bytes)[0].reshape(org.burst_length // 2, 2, config.chips)
    return (raw[:, 0, :].astype(np.uint16) | (raw[:, 1, :].astype(np.uint16) << 8)).T.copy()


def host_burst(elements, config: PIMConfig) -> int:
    """The host write burst that stores ``elements[c][j]`` (FP16 bit patterns, shape (chips, burst_length / 2))
    as element ``j`` of chip ``c`` after re-layout: host element ``chips * j + c``."""
    _check(config)
    org = config.dram.org
    e = np.asarray(elements, dtype=np.uint16)
    if e.shape != (config.chips, org.burst_length // 2):
        raise ValueError(f"elements must have shape {(config.chips, org.burst_length // 2)}, got {e.shape}")
    return int.from_bytes(e.T.reshape(-1).astype("<u2").tobytes(), "little")


# ---- hardware ---------------------------------------------------------------------------------------------------

class Relayout(wiring.Component):
    """The re-layout unit in the write-data path of the rank PU buffer chip, for ``config`` (a :class:`PIMConfig`).

    Ports (one transfer = one command clock = ``org.beats_per_clock`` beats = ``org.clock_bits`` DQ bits):

    * ``i``: In(stream of ``clock_bits``): the write data of one clock from the host, beat ``b`` in bits
      ``[b * C * 8, (b + 1) * C * 8)``; ``valid`` = the host drives write data (its DQS toggles) in this clock.
      ``i.ready`` is always 1: a DDR data bus cannot be stalled.
    * ``o``: Out(stream of ``clock_bits``): the re-laid-out clock toward the DRAM chips' DQ pins; ``valid`` = the
      buffer chip drives write data (DQS) in this clock; the payload is 0 when not valid. ``o.ready`` is ignored:
      the DRAM samples its pins in their cycle.

    Double buffer: the two beats of each pair are held in ``buf_beat{2p}`` (beat A, first half-clock) and
    ``buf_beat{2p+1}`` (beat B, second half-clock); the exchange needs both, so it reads the buffer, and the
    buffer takes the next pair while the exchanged one is on the DRAM side. Then ``relayout_latency - 1`` plain
    register stages.

    Latency: exactly ``config.relayout_latency`` clocks from ``i`` to ``o`` for every clock word, at one word
    per clock (a burst of ``burst_cycles`` clocks in gives ``burst_cycles`` clocks out; back-to-back bursts stay
    back to back). No bus cycle is added: only the whole write-data stream is shifted by the latency.
    """

    def __init__(self, config: PIMConfig):
        _check(config)
        self.config = config
        org = config.dram.org
        self.beat_bits = org.bus_width
        self.latency = config.relayout_latency
        super().__init__({
            "i": In(stream.Signature(org.clock_bits)),
            "o": Out(stream.Signature(org.clock_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        org = self.config.dram.org
        C, BB, BPC = self.config.chips, self.beat_bits, org.beats_per_clock

        buf = [Signal(BB, name=f"buf_beat{b}") for b in range(BPC)]
        buf_valid = Signal()
        m.d.comb += self.i.ready.eq(1)
        m.d.sync += buf_valid.eq(self.i.valid)
        with m.If(self.i.valid):
            m.d.sync += [buf[b].eq(self.i.payload[b * BB:(b + 1) * BB]) for b in range(BPC)]

        out_bytes = []
        for p in range(BPC // 2):
            pair = Cat(buf[2 * p], buf[2 * p + 1])
            byte = [pair[8 * k:8 * k + 8] for k in range(2 * C)]
            out_bytes += [byte[2 * k] for k in range(C)] + [byte[2 * k + 1] for k in range(C)]
        exchanged = Cat(*out_bytes)

        data, valid = Mux(buf_valid, exchanged, 0), buf_valid
        for s in range(1, self.latency):
            d = Signal(org.clock_bits, name=f"stage{s}_data")
            v = Signal(name=f"stage{s}_valid")
            m.d.sync += [d.eq(data), v.eq(valid)]
            data, valid = d, v
        m.d.comb += [self.o.payload.eq(data), self.o.valid.eq(valid)]
        return m
