"""Top-level components that get their own Verilog module: name -> factory.

The names are the Verilog module names written by ``ndpim verilog`` and used by the lint, cocotb, synthesis
and benchmark targets.
"""

from .fp import FP16, FP32, FPMul, FPAdd, FPMAC
from .fp.div import FPDiv
from .fp.convert import FPConvert
from .fp.max import FPMax
from .fp.exp import FPExp

__all__ = ["FP_TOPS", "TOPS"]

FP_TOPS = {
    "fp16_mul": lambda: FPMul(fmt=FP16),
    "fp16_mul_fp32": lambda: FPMul(fmt=FP16, out_fmt=FP32),
    "fp16_add": lambda: FPAdd(fmt=FP16),
    "fp32_add": lambda: FPAdd(fmt=FP32),
    "fp16_div": lambda: FPDiv(),
    "fp16_to_fp32": lambda: FPConvert(src=FP16, dst=FP32),
    "fp32_to_fp16": lambda: FPConvert(src=FP32, dst=FP16),
    "fp16_mac_fp16": lambda: FPMAC(acc="fp16"),
    "fp16_mac_fp32": lambda: FPMAC(acc="fp32"),
    "fp16_max": lambda: FPMax(),
    "fp16_exp": lambda: FPExp(),
}

TOPS = dict(FP_TOPS)

from .memctl.controller import MemoryController
from .memctl.timing import DDR4_3200, LPDDR5X_8533

MEMCTL_TOPS = {
    "memctl_ddr4_3200": lambda: MemoryController(config=DDR4_3200),
    "memctl_lpddr5x_8533": lambda: MemoryController(config=LPDDR5X_8533),
}

TOPS.update(MEMCTL_TOPS)

from .ndp.config import PAPER as NDP_PAPER, TINY as NDP_TINY
from .ndp.decoder import DescriptorDecoder
from .ndp.pe_array import PEArray
from .ndp.softmax import SoftmaxUnit
from .ndp.core import NDPCore
from .memctl.addrmap import AddressMap

NDP_TOPS = {
    "ndp_decoder": lambda: DescriptorDecoder(config=NDP_PAPER),
    # lanes x batch = 16 FPMACs with FP32 accumulators: the one-channel slice's array (8 lanes x 2 rows).
    "ndp_pe_array": lambda: PEArray(lanes=8, batch=2, acc="fp32", max_k=4096, acc_columns=16),
    "ndp_softmax": lambda: SoftmaxUnit(lanes=8, max_len=1024, max_rows=128),
    # The whole core (tiny preset: 8 lanes x 2 PE rows, KB buffers) for the DDR4-3200 controller's
    # 512-bit bursts, burst addresses and default 8-bit tags (the core drives tags 0: responses are in order).
    "ndp_core": lambda: NDPCore(config=NDP_TINY, mem_burst_bits=DDR4_3200.org.burst_bits,
                                mem_addr_bits=AddressMap(DDR4_3200.org).addr_bits, mem_tag_width=8),
}

TOPS.update(NDP_TOPS)

from .cxl import CSRBank, RegisterMap
from .cxl.guard import MemoryGuard
from .cxl.device import CXLDevice
from .cxl.filter import HostFilter
from .cxl.regmap import QueueLayout

CXL_TOPS = {
    # MMIO register bank of the CXL front end for 4 requester queues (docs/cxl_regmap.md).
    "cxl_csr": lambda: CSRBank(RegisterMap(num_queues=4), layout=QueueLayout.for_config(NDP_TINY)),
    # Device-side address filter of host CXL.mem accesses (queue window + PASID check), 4 queues, the tiny core's
    # queue layout, on the DDR4-3200 controller's burst addresses (docs/cxl_isolation.md).
    "cxl_filter": lambda: HostFilter(4, AddressMap(DDR4_3200.org).addr_bits, QueueLayout.for_config(NDP_TINY)),
    # Per-queue address window guard on the DDR4-3200 controller's request stream (docs/cxl_isolation.md).
    "cxl_guard": lambda: MemoryGuard(addr_bits=AddressMap(DDR4_3200.org).addr_bits,
                                     burst_bytes=DDR4_3200.org.burst_bits // 8, tag_width=8),
    # The whole device: CSR bank, queue engine, guard, arbiter and the tiny NDP core, 4 queues, on the
    # DDR4-3200 controller's burst addresses and 8-bit tags (docs/cxl_device.md).
    "cxl_device": lambda: CXLDevice(config=NDP_TINY, num_queues=4, mem_addr_bits=AddressMap(DDR4_3200.org).addr_bits,
                                    mem_tag_width=8),
}

TOPS.update(CXL_TOPS)

from dataclasses import replace as _replace

from .pim.config import PAPER as PIM_PAPER
from .pim.bank_pu import BankPU
from .pim.relayout import Relayout
from .pim.adder_unit import AdderUnit
from .pim.softmax_unit import PIMSoftmaxUnit, PIMNormalizer
from .pim.rank_pu import RankPU, PIMSequencer

PIM_TOPS = {
    # One bank PU (4 FP16 multipliers + 4 adders; identical for the paper and tiny presets), docs/pim_bank_pu.md.
    "pim_bank_pu": lambda: BankPU(PIM_PAPER),
    # The same with the FP32 context-accumulator option (PIMConfig.context_acc = "fp32"; docs/pim_bank_pu.md).
    "pim_bank_pu_fp32": lambda: BankPU(_replace(PIM_PAPER, context_acc="fp32")),
    # The rank PU's re-layout unit: two-beat double buffer in the write-data path (docs/pim_relayout.md).
    "pim_relayout": lambda: Relayout(PIM_PAPER),
    # The rank PU's adder unit (8 FP16 adders: chip tree / context accumulators), chunk softmax unit and per-chunk
    # normalizer (docs/pim_rank_pu.md).
    "pim_adder_unit": lambda: AdderUnit(PIM_PAPER),
    "pim_softmax": lambda: PIMSoftmaxUnit(PIM_PAPER),
    "pim_normalizer": lambda: PIMNormalizer(PIM_PAPER),
    # The rank PU of one paper rank: sequencer (all-bank command program, dynamic refresh) + 128 bank PUs' data
    # routing + adder unit + softmax unit + normalizer + rank buffer (docs/pim_rank_pu_sequencer.md); and the
    # sequencer alone.
    "pim_rank_pu": lambda: RankPU(PIM_PAPER),
    "pim_rank_pu_seq": lambda: PIMSequencer(PIM_PAPER),
}

TOPS.update(PIM_TOPS)
