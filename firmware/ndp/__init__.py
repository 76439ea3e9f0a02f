"""Host/test-side encoders and decoders for the PLoRA NDP core (descriptors, expected completions)."""
