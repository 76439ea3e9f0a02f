"""GPU model: calibrated operator times (roofline + fitted efficiencies over shapes), analytic attention, the
measured all-reduce; both the idealized floor and the calibrated time. See host.gpu.model."""

from host.gpu.model import (GemmParams, EltParams, Calibration, load_calibration, soft_roofline, OpTime,
                            IterationTime, GPUModel, get_gpu_model)
from host.gpu.allreduce import AllReduceModel

__all__ = ["GemmParams", "EltParams", "Calibration", "load_calibration", "soft_roofline", "OpTime",
           "IterationTime", "GPUModel", "get_gpu_model", "AllReduceModel"]
