"""The hybrid of PLoRA and L3 at LLaMA scale (issue 34 item 2): GPU + CXL NDP pool + host DIMM-PIM, with the same
decision code as the tiny end-to-end hybrid of ``make demo`` (:mod:`host.hybrid.decisions`). docs/hybrid.md."""
