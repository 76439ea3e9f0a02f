"""CXL front end of the NDP device: the MMIO register map (one definition) and the CSR bank that implements it."""

from .regmap import Register, RegisterMap, QueueLayout  # noqa: F401
from .csr import CSRBank  # noqa: F401
