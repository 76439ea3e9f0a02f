"""PLoRA host: the GPU memory manager (strategies E1-E4, cost model, Algorithm 1, temperature), the NDP
device timing, the PLoRA system and its baselines for the serving engine, sweeps, figures and the CLI.
See docs/plora_host.md."""
