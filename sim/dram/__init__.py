"""Python-side DRAM tools: command-trace decoding and an independent JEDEC timing checker."""

from .trace import TraceCommand, decode_trace, encode_trace
from .checker import TimingViolation, check_trace, describe

__all__ = ["TraceCommand", "decode_trace", "encode_trace", "TimingViolation", "check_trace", "describe"]
