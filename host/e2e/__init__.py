"""The end-to-end run: a tiny LLaMA-style model served by the hybrid PLoRA + L3 system through the devices' RTL
(``ndpim demo``; docs/e2e.md)."""
