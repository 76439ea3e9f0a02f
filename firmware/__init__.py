"""What the devices run: NDP descriptor encoders/decoders (firmware.ndp) and DRAM/PIM command programs
(firmware.pim_stream)."""
