"""Benchmarks: each module has main(argv), prints its figures and writes build/bench/<name>.json (`ndpim bench NAME`)."""
