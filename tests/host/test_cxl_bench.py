"""host/cxl_bench.py's inputs (no RTL: the bench itself is ``python -m host.cxl_bench``): its GEMV scripts run on
the golden device with every completion OK and the right result, for the default and the 64 KiB case, and a bad
argument is refused by name."""

import numpy as np
import pytest

from host import cxl_bench as B


@pytest.mark.parametrize("k, n, ring", [(32, 32, 2048), (256, 128, 65536)])
def test_gemv_scripts_complete_on_the_golden_device(k, n, ring):
    d, hs = B.gemv_script(3, k, n, "lpddr5x", 2, ring=ring)
    run = d.run("golden")
    recs = [run.completion(h) for h in hs]
    assert all(r.ok for r in recs) and [r.result_bytes for r in recs] == [2 * n] * 3
    # the result is x A of the stored operand (FP16 arithmetic: to within 0.1 on outputs of unit scale)
    a = np.frombuffer(bytes(run.memory[0x8000:0x8000 + 2 * k * n]), "<f2").reshape(k, n).astype(np.float64)
    x = np.frombuffer(d.submissions[0].input, "<f2")[:k].astype(np.float64)
    got = recs[0].result_bits(n).view(np.float16).astype(np.float64)
    assert np.abs(got - x @ a).max() < 0.1 and np.abs(x @ a).max() > 0.5

def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        B.main(["--gemvs", "1"])
    assert "--gemvs must be >= 2, got 1" in capsys.readouterr().err
