"""Numpy golden models of the RTL blocks, bit-exact on raw bit patterns."""
