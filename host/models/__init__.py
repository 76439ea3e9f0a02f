"""Configurations as data, each value with its source: LLMs (:mod:`host.models.llm`), host hardware
(:mod:`host.models.hardware`: GPUs and nodes) and the pattern near-memory device configs follow
(:mod:`host.models.devices`)."""

from host.models.llm import LLMConfig, LinearShape, MODELS, get_model
from host.models.hardware import (GPUConfig, NodeConfig, GPUS, NODES, get_gpu, get_node, A100_80GB,
                                  H100_SXM_80GB, DGX_A100, H100_NODE)
from host.models.devices import DeviceConfig, DEVICES, register_device, get_device

__all__ = ["LLMConfig", "LinearShape", "MODELS", "get_model", "GPUConfig", "NodeConfig", "GPUS", "NODES",
           "get_gpu", "get_node", "A100_80GB", "H100_SXM_80GB", "DGX_A100", "H100_NODE", "DeviceConfig",
           "DEVICES", "register_device", "get_device"]
