"""FP arithmetic units: every floating-point operation in ndpim is one of these components."""

from .format import FloatFormat, FP16, FP32, format_by_name  # noqa: F401
from .mul import FPMul  # noqa: F401
from .add import FPAdd  # noqa: F401
from .mac import FPMAC  # noqa: F401
