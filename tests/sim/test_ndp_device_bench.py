"""sim/bench/ndp_device.py's inputs (no RTL: the bench itself is `make bench-ndp-device`): every case's program
is accepted by the slice it runs on, fits the data-keeping channels, and a bad case is refused by name."""

import pytest

from firmware.ndp.descriptor import ErrorCode
from hdl.ndp.config import slice_preset
from sim.bench import ndp_device as B


@pytest.mark.parametrize("case", B.CASES)
def test_case_programs_fit_the_slice(case):
    ch = 4 if case == "attention_grouped" else 2        # (the grouped shares need four channels' capacity)
    cfg = B.slice_config(ch)
    assert cfg.lanes == slice_preset(ch).lanes and cfg.device_bytes == ch * (2 << 20)   # 2 MiB per channel
    stores, kernel = B.kernel_program(case, cfg)
    assert stores and kernel
    for d, _ in stores + kernel:
        assert d.validate(cfg) == ErrorCode.OK, (case, d)
        assert d.base_addr + d.operand_bytes <= cfg.device_bytes


def test_bad_case_is_refused():
    with pytest.raises(ValueError, match="unknown case 'e5'; allowed: e4, attention, e3, e2, gemv"):
        B.kernel_program("e5", B.slice_config(2))
    # the grouped shares on a slice too small for them: refused by the firmware's layout, naming the capacity
    with pytest.raises(ValueError, match=r"beyond config.device_bytes \(4194304\)"):
        B.kernel_program("attention_grouped", B.slice_config(2))
    assert "attention_grouped" in B.CASES and "attention_grouped" not in B.ALL_CASES


def test_cli_refuses_a_case_the_slice_cannot_hold(capsys):
    """The bench's command line refuses the grouped shares on 2 channels before building anything: exit 2, one
    line naming the case, the channels and the capacity."""
    with pytest.raises(SystemExit) as e:
        B.main(["--kernel", "attention_grouped", "--channels", "2", "--out", "/nonexistent/never-written.json"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--kernel attention_grouped does not fit --channels 2" in err and "device_bytes (4194304)" in err


def test_grouped_case_runs_the_grouped_kernels():
    """``attention_grouped``'s stream is the grouped dataflow (every READ_COMPUTE a GROUP descriptor), NARROW for
    the 16- and 64-token shares and W tiles from 256, GQA 1 and 4."""
    cfg = B.slice_config(4)
    _, kernel = B.kernel_program("attention_grouped", cfg)
    assert kernel and all(d.group for d, _ in kernel)
    assert {bool(d.narrow) for d, _ in kernel} == {True, False}
    rows = {d.input_dim0 for d, _ in kernel}
    g = cfg.lanes // cfg.group_lanes
    assert {g, 4 * g, 2 * g, 8 * g} <= rows            # W tiles of g heads and NARROW of 2 g, GQA 1 and 4


@pytest.mark.parametrize("channels", [1, 2])
def test_device_init_places_every_byte_where_the_memory_reads_it(channels):
    """``--preload``'s DRAM contents read back through the device memory's own fill model
    (sim.devmem.model.storage_fill: interleave + controller address map + flat burst index) give the image; a
    byte moved to another burst is caught."""
    import numpy as np
    from hdl.memctl.devmem import DeviceMemory, GRANULE_BYTES
    from sim.devmem.model import storage_fill
    dram = B.data_config()
    image = np.random.default_rng(channels).integers(0, 256, 4 * GRANULE_BYTES * channels + 96, np.uint8)
    image[100:164] = 0                                   # all-zero bursts are left out of the dict
    inits = B.device_init(image.tobytes(), channels, dram)
    dm = DeviceMemory(config=dram, channels=channels)
    dm._MustUse__silence = True

    def readback(inits):
        fill = storage_fill(dm, inits)
        return b"".join(fill(g).to_bytes(GRANULE_BYTES, "little") for g in range(-(-image.size // GRANULE_BYTES)))

    assert readback(inits)[:image.size] == image.tobytes()
    c = next(i for i, d in enumerate(inits) if len(d) >= 2)
    (a0, v0), (a1, v1) = list(inits[c].items())[:2]
    bad = [dict(d) for d in inits]
    bad[c][a0], bad[c][a1] = v1, v0
    assert readback(bad)[:image.size] != image.tobytes()


def test_attention_batch_stream_bit_exact_on_the_lpddr5x_slice():
    """Issue 29 item 1 on the RTL: a decode batch's attention (8 shares of 16, 64, 256 and 1,024 tokens, GQA 1 and
    4, head dim 128, and 2 shares of half a beat, one half-beat tile each) as one descriptor stream on the core's one-channel slice over the LPDDR5X-8533 memory system
    (controller, DRAM model; Verilator): every returned beat and completion bit-exact against the golden core,
    no DRAM timing violation, and the performance model within 3 % of the RTL's cycles. (~1 min: the build is
    most of it.)"""
    r = B.run("attention_batch", channels=1, preload=True)
    print(f"\nattention_batch on the 1-channel LPDDR5X slice: {r['rtl_cycles_kernel']} CK, model "
          f"{100 * r['model_rel_err_kernel']:+.2f} %")
    assert r["bitexact"] and r["timing_violations"] == 0 and r["device_errors"] == 0
    assert r["descriptors"] > 3 * len(B.BATCH_SHARES)            # 10 entries, several token tiles each
    assert abs(r["model_rel_err_kernel"]) <= 0.03


def test_attention_batch_results_merge_on_the_host():
    """The stream's per-entry partials (golden core, the slice's geometry) merged on the host equal each share's
    float64 attention to within FP16 accumulation; the check can fail (one share's output against another's
    reference is caught)."""
    import numpy as np
    from firmware.ndp import kernels as K
    from sim.golden.ndp_core import GoldenCore
    from sim.golden.attention import merge_partials, reference_attention, prepare_query
    cfg = B.slice_config(1)
    rng = np.random.default_rng(4)
    base, stores, entries, refs = 0, [], [], []
    for l, g in ((16, 1), (64, 4), (40, 1)):
        kv = K.kv_layout(128, l, config=cfg, rows=g, base=base)
        base = kv["end"]
        k, v = B._rand(rng, (l, 128), 0.5), B._rand(rng, (l, 128), 0.5)
        q = B._rand(rng, (g, 128))
        stores += K.kv_store(k, v, kv, config=cfg).program
        entries.append((prepare_query(q), kv))
        refs.append(reference_attention(q, k, v))
    core = GoldenCore(cfg, base)
    core.run(stores)
    kb = K.attention_batch(entries, config=cfg)
    parts = kb.results(core.run(kb.program))
    assert len(parts) == 3
    outs = [merge_partials(dict(enumerate(p))) for p in parts]
    for o, ref in zip(outs, refs):
        assert np.max(np.abs(o - ref.reshape(o.shape))) <= 5e-3 * np.max(np.abs(ref))
    assert np.max(np.abs(outs[0] - refs[2].reshape(outs[0].shape))) > 5e-3 * np.max(np.abs(refs[2]))
