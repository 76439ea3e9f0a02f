"""IEEE 754 binary interchange formats used by the FP units (binary16 and binary32)."""

from dataclasses import dataclass

__all__ = ["FloatFormat", "FP16", "FP32", "format_by_name", "FORMATS"]


@dataclass(frozen=True, kw_only=True)
class FloatFormat:
    """An IEEE 754 binary format: ``exp_bits`` exponent bits, ``frac_bits`` stored fraction bits."""

    name: str
    exp_bits: int
    frac_bits: int

    def __post_init__(self):
        if not (2 <= self.exp_bits <= 11):
            raise ValueError(f"{self.name}: exp_bits must be in 2..11, got {self.exp_bits}")
        if not (1 <= self.frac_bits <= 52):
            raise ValueError(f"{self.name}: frac_bits must be in 1..52, got {self.frac_bits}")

    @property
    def width(self) -> int:
        return 1 + self.exp_bits + self.frac_bits

    @property
    def precision(self) -> int:
        """Significand bits including the hidden bit (11 for binary16)."""
        return self.frac_bits + 1

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def exp_max(self) -> int:
        """The all-ones exponent field (inf and NaN)."""
        return (1 << self.exp_bits) - 1

    @property
    def sign_mask(self) -> int:
        return 1 << (self.width - 1)

    @property
    def inf_bits(self) -> int:
        return self.exp_max << self.frac_bits

    @property
    def qnan_bits(self) -> int:
        """The canonical quiet NaN every unit returns (SoftFloat's default NaN: 0x7E00, 0x7FC00000)."""
        return self.inf_bits | (1 << (self.frac_bits - 1))

    @property
    def one_bits(self) -> int:
        return self.bias << self.frac_bits


FP16 = FloatFormat(name="fp16", exp_bits=5, frac_bits=10)
FP32 = FloatFormat(name="fp32", exp_bits=8, frac_bits=23)
FORMATS = {f.name: f for f in (FP16, FP32)}


def format_by_name(name) -> FloatFormat:
    if isinstance(name, FloatFormat):
        return name
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown float format {name!r}; allowed: {sorted(FORMATS)}") from None
