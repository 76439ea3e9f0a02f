"""Configurations as data, each value with its source: LLMs (:mod:`host.models.llm`), host hardware
(:mod:`host.models.hardware`: GPUs and nodes) and the pattern device configs follow
(:mod:`host.models.devices`)."""

from host.models.llm import LLMConfig, LinearShape, MODELS, get_model

__all__ = ["LLMConfig", "LinearShape", "MODELS", "get_model"]
