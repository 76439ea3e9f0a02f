"""The bank PU's Verilog is the same text in every Python process (its clock-domain ports used to come out in a
hash-dependent order, so the Verilator cache missed and every run rebuilt the PIM tops)."""

import hashlib
import os
import subprocess
import sys

from sim.pim.fused import _sorted_port_lists

CODE = ("import hashlib; from hdl.pim.config import TINY; from sim.pim.fused import bank_pu_verilog; "
        "print(hashlib.sha256(bank_pu_verilog(TINY).encode()).hexdigest())")


def test_bank_pu_verilog_is_the_same_in_every_process():
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        digests.add(subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                                   check=True).stdout.strip())
    assert len(digests) == 1


def test_port_lists_sorted_and_escaped_names_kept():
    text = "module top(b, \\a.x , c);\n  input b;\nendmodule\nmodule \\top.sub (z,\n  y);\n"
    got = _sorted_port_lists(text)
    assert got.startswith("module top(\\a.x , b, c);")          # the escaped name keeps its terminating space
    assert "module \\top.sub (y, z);" in got
    assert hashlib.sha256(_sorted_port_lists(got).encode()).digest() == hashlib.sha256(got.encode()).digest()
