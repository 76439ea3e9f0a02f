"""PLoRA near-data-processing core: configuration, the read-compute descriptor, instruction buffer and decoder."""

from .config import NDPConfig, TINY, PAPER, NDP_PRESETS, ndp_preset  # noqa: F401
from .descriptor import (DescType, DescOp, DType, ErrorCode, DESCRIPTOR_LAYOUT, command_layout)  # noqa: F401
from .decoder import InstructionBuffer, DescriptorDecoder  # noqa: F401
