"""FP arithmetic units: every floating-point operation in ndpim is one of these components."""

from .format import FloatFormat, FP16, FP32, format_by_name  # noqa: F401
from .mul import FPMul  # noqa: F401
from .add import FPAdd  # noqa: F401
from .mac import FPMAC  # noqa: F401
from .div import FPDiv  # noqa: F401
from .convert import FPConvert  # noqa: F401
from .max import FPMax  # noqa: F401
from .exp import FPExp  # noqa: F401
