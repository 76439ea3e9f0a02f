"""NDP kernels (firmware/ndp/kernels.py) and the host merge (sim/golden/attention.py), run on the golden core."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from hdl.ndp.config import TINY, PAPER, slice_preset
from hdl.ndp.descriptor import DescOp, DescType, ErrorCode
from firmware.ndp import kernels as K
from sim.golden.attention import merge_partials, reference_attention, prepare_query, to_fp16_bits
from sim.golden.ndp_core import GoldenCore, trans_layout, trans_unlayout
from sim.golden.pe_array import gemm_mode
from sim.golden import fp16

TINY16 = replace(TINY, name="tiny-fp16", acc="fp16")
# TINY with a DRAM buffer large enough for one device to hold a whole 256-position KV share (d = 32)
TINY_BIG = replace(TINY, name="tiny-big", dram_buffer_bytes=32768)
# Item 3 of issue 11: D, LoRA ranks, attention shares and GQA groups at the paper geometry.
ITEM3_D = (768, 2048, 4096, 5120, 8192, 11008, 13824, 14336)
ITEM3_R = (8, 16, 32, 64, 128)


def rand_bits(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float16).view(np.uint16)


def all_ok(kernel, cfg):
    return all(d.validate(cfg) == ErrorCode.OK for d, _ in kernel.program)


def ref_xa(x, a, cfg, layout):
    """x A exactly as the tiles compute it: each K-tile in its dataflow, partials added in tile order in the
    accumulator format, then one rounding to FP16."""
    ftype = np.float32 if cfg.acc == "fp32" else np.float16
    acc = None
    for _, k0, k1 in layout["a"]:
        mode = "trans" if (k1 - k0) % cfg.lanes == 0 else "trans_half"
        t = gemm_mode(x[:, k0:k1], a[k0:k1], acc=cfg.acc, lanes=cfg.lanes, mode=mode)
        acc = t if acc is None else (acc.view(ftype) + t.view(ftype)).view(t.dtype)
    return fp16.from_f32(acc) if cfg.acc == "fp32" else acc


def ref_mb(m, b, cfg, layout):
    """m B panel by panel (row or row_half dataflow)."""
    out = []
    for _, n0, n1 in layout["b"]:
        mode = "row" if (n1 - n0) % cfg.lanes == 0 else "row_half"
        y = gemm_mode(m, b[:, n0:n1], acc=cfg.acc, lanes=cfg.lanes, mode=mode)
        out.append(fp16.from_f32(y) if cfg.acc == "fp32" else y)
    return np.concatenate(out, axis=1)


# ---- validation ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg,d,r,batch,hd,l,rows", [
    (TINY, 64, 16, 9, 32, 64, 1), (TINY, 68, 8, 1, 16, 128, 2), (TINY16, 64, 16, 4, 32, 64, 1),
    (PAPER, 4096, 64, 300, 128, 2048, 8), (PAPER, 768, 128, 1, 128, 1024, 4),
    (slice_preset(2), 2056, 16, 5, 128, 512, 4)])
def test_kernels_validate(cfg, d, r, batch, hd, l, rows):
    rng = np.random.default_rng(0)
    lay = K.lora_layout(d, r, config=cfg)
    kv = K.kv_layout(hd, l, config=cfg, rows=rows)
    x = rand_bits(rng, (batch, d))
    ks = [K.lora_e2_loads(lay, config=cfg), K.lora_e3(x, lay, config=cfg), K.lora_e4(x, lay, config=cfg),
          K.attention_integral(rand_bits(rng, (rows, hd)), kv, config=cfg),
          K.lora_store(rand_bits(rng, (d, r)), rand_bits(rng, (r, d)), lay, config=cfg),
          K.kv_store(rand_bits(rng, (l, hd)), rand_bits(rng, (l, hd)), kv, config=cfg)]
    for k in ks:
        assert all_ok(k, cfg), k.name
    for d_, _ in ks[-1].program + ks[-2].program:
        assert d_.operand_bytes % cfg.align_bytes == 0 and d_.base_addr % cfg.align_bytes == 0


def test_every_item3_shape_builds_on_the_paper_geometry():
    """Every LoRA shape of issue 11 item 3 (D x R x batch 1..256) and every attention share (up to 32K tokens,
    head dim 128, GQA groups 1/4/8) becomes a program whose every descriptor the paper core accepts; padding
    never multiplies the bytes read (each A tile / B panel / K^T tile / V tile is read exactly once per batch
    chunk)."""
    for d in ITEM3_D:
        for r in ITEM3_R:
            lay = K.lora_layout(d, r, config=PAPER)
            assert sum(k1 - k0 for _, k0, k1 in lay["a"]) == d and sum(n1 - n0 for _, n0, n1 in lay["b"]) == d
            for b in (1, 3, 256):
                x = np.zeros((b, d), np.uint16)
                for kern in (K.lora_e4(x, lay, config=PAPER), K.lora_e3(x, lay, config=PAPER)):
                    assert all_ok(kern, PAPER)
                    chunks = -(-b // kern.meta["chunk"])
                    a_bytes = sum(dsc.operand_bytes for dsc, _ in kern.program if dsc.trans)
                    assert a_bytes == chunks * 2 * d * r
    for l in (512, 4096, 32768):
        for g in (1, 4, 8):
            kv = K.kv_layout(128, l, config=PAPER, rows=g)
            att = K.attention_integral(np.zeros((g, 128), np.uint16), kv, config=PAPER)
            assert all_ok(att, PAPER) and len(att.program) == 3 * len(kv["tiles"])
            assert sum(dsc.operand_bytes for dsc, _ in att.program) == 2 * 2 * 128 * l


def test_tiles_accumulate_on_the_device():
    """E4 K-tiles: PARTIAL, ACC + PARTIAL, ..., ACC; E3: the last tile KEEPs, then one CHAIN per B panel; a
    lanes/2 tail is a TRANS half block (E4) and a half-beat row panel (E3)."""
    cfg = slice_preset(1)                              # 8 KiB tiles: d = 2052 r = 16 -> tail + 8 full tiles
    lay = K.lora_layout(2052, 16, config=cfg)
    assert [(k0, k1 - k0) for _, k0, k1 in lay["a"]] == [(2048, 4)] + [(256 * i, 256) for i in range(8)]
    assert [n1 - n0 for _, n0, n1 in lay["b"]] == [256] * 8 + [4]
    e4 = K.lora_e4(np.zeros((3, 2052), np.uint16), lay, config=cfg)
    flags = [(d.trans, d.acc, d.partial, d.keep) for d, _ in e4.program]
    assert flags == [(True, False, True, False)] + [(True, True, True, False)] * 7 + [(True, True, False, False)]
    assert e4.program[0][0].operand_dim0 == 4 and e4.program[0][1].shape == (3, 4)
    assert e4.program[1][1].shape == (3, 256)
    e3 = K.lora_e3(np.zeros(2052, np.uint16), lay, config=cfg)
    ops = [(d.op, d.keep, d.chain, d.trans) for d, _ in e3.program]
    assert ops[8] == (DescOp.GEMV, True, False, True)
    assert ops[9:] == [(DescOp.GEMV, False, True, False)] * 9 and e3.program[-1][0].operand_dim1 == 4


@pytest.mark.parametrize("d,r,want", [
    (5120, 128, [2048, 1536, 1536]),                        # greedy: 2048, 2048, 1024
    (11008, 128, [256, 2048, 2048, 2048, 1536, 1536, 1536]),  # greedy: 5 x 2048, 512, then the 256-row tail
    (4096, 128, [2048, 2048]), (768, 8, [256, 512]), (14336, 64, [3584] * 4), (256, 16, [256]),
    (14336, 8, [14336]), (3 * 16384, 8, [16384] * 3)])                  # r = 8: max_k (16,384 rows) binds
def test_k_tiles_are_balanced_with_the_half_tail_first(d, r, want):
    """Issue 29 item 2: the fewest K-tiles within the tile limit, their block counts within one of each other
    (larger first), the lanes / 2 tail first; together they cover 0..d once."""
    tiles = K.k_tiles(d, r, PAPER)
    assert [k1 - k0 for k0, k1 in tiles] == want
    cover = sorted(tiles)
    assert cover[0][0] == 0 and cover[-1][1] == d and all(a[1] == b[0] for a, b in zip(cover, cover[1:]))
    L = PAPER.lanes
    full = [k1 - k0 for k0, k1 in tiles if (k1 - k0) % L == 0]
    per = min(K.tile_bytes(PAPER) // (2 * r), PAPER.max_k) // L * L
    assert len(full) == -(-(d // L * L) // per)
    assert not full or (max(full) - min(full) <= PAPER.lanes and max(full) <= per)


def test_load_chunks_fill_the_return_ring():
    """E2 LOADs in chunks as large as the return ring (and the DRAM ring and the 20-bit field) allow, whole
    store granules: the fewest descriptors (issue 29 item 3: smaller chunks were measured and not kept)."""
    assert K.load_chunk_bytes(PAPER) == PAPER.output_buffer_bytes == 512 << 10
    assert K.load_chunk_bytes(TINY) == TINY.output_buffer_bytes
    small = replace(TINY, output_buffer_bytes=4 * TINY.dram_buffer_bytes)   # the DRAM ring the smaller
    assert K.load_chunk_bytes(small) == TINY.dram_buffer_bytes
    lay = K.lora_layout(4096, 128, config=PAPER)
    e2 = K.lora_e2_loads(lay, config=PAPER)
    assert len(e2.program) == 2 * 4096 * 128 * 2 // (512 << 10)
    assert all(dsc.operand_bytes == 512 << 10 for dsc, _ in e2.program)


def test_attention_program_shape():
    kv = K.kv_layout(32, 64, config=TINY)
    k = K.attention_integral(np.zeros(32, np.uint16), kv, config=TINY)
    assert kv["tile"] == 32 and len(kv["tiles"]) == 2        # the kept scores (512 B slot) bound the tile
    d0, d1, d2 = (d for d, _ in k.program[:3])
    assert (d0.op, d0.keep, d0.chain, d0.operand_dim0, d0.operand_dim1) == (DescOp.GEMV, True, False, 32, 32)
    assert (d1.op, d1.keep, d1.chain, d1.input_dim0, d1.input_dim1) == (DescOp.SOFTMAX, True, True, 1, 32)
    assert (d2.op, d2.trans, d2.chain, d2.operand_dim0, d2.operand_dim1) == (DescOp.GEMV, True, True, 32, 32)


def test_bad_shapes_raise():
    lay = K.lora_layout(64, 16, config=TINY)
    x = np.zeros((2, 64), np.uint16)
    with pytest.raises(ValueError, match=r"^d \(58\) must be a multiple of lanes \(8\) or of lanes / 2"):
        K.lora_layout(58, 16, config=TINY)
    with pytest.raises(ValueError, match=r"even rank"):
        K.lora_layout(68, 7, config=TINY)
    with pytest.raises(ValueError, match=r"^base \(32\) must be a multiple of config.align_bytes"):
        K.lora_layout(64, 16, config=TINY, base=32)
    with pytest.raises(ValueError, match=r"^x must be \(d,\) or \(batch, d\)"):
        K.lora_e4(np.zeros((2, 32), np.uint16), lay, config=TINY)
    with pytest.raises(ValueError, match=r"^x must be FP16 bit patterns"):
        K.lora_e4(np.zeros((2, 64), np.float32), lay, config=TINY)
    with pytest.raises(ValueError, match=r"exceeds the tile limit"):
        K.lora_layout(64, 256, config=TINY)
    with pytest.raises(ValueError, match=r"^l \(20\) must be a multiple"):
        K.kv_layout(32, 20, config=TINY)
    with pytest.raises(ValueError, match=r"^q has 5 rows"):
        K.attention_integral(np.zeros((5, 32), np.uint16), K.kv_layout(32, 8, config=TINY), config=TINY)
    with pytest.raises(ValueError, match="config must be an NDPConfig"):
        K.lora_e4(x, lay, config="tiny")
    with pytest.raises(ValueError, match=r"^addr \(2\) must be a multiple"):
        K.store_tensor(2, x, config=TINY)
    with pytest.raises(ValueError, match=r"^a_bits must be \(d, r\)"):
        K.lora_store(np.zeros((64, 16), np.uint16), np.zeros((64, 16), np.uint16), lay, config=TINY)
    with pytest.raises(ValueError, match="beyond config.device_bytes"):
        K.lora_layout(64, 16, config=TINY, base=TINY.device_bytes - 64)


def test_kernel_results_raise_on_error_status():
    from sim.golden.ndp_core import Completion
    k = K.lora_e4(np.zeros(64, np.uint16), K.lora_layout(64, 16, config=TINY), config=TINY)
    with pytest.raises(K.KernelError, match="MISALIGNED"):
        k.results([Completion(0, ErrorCode.MISALIGNED, np.zeros(0, np.uint16))] * len(k.program))
    with pytest.raises(ValueError, match=r"expected \d+ completions"):
        k.results([])


# ---- on the golden core --------------------------------------------------------------------------------

def test_trans_layout_round_trip():
    rng = np.random.default_rng(9)
    for k, n, lanes, group in ((32, 12, 8, 16), (4, 6, 8, 16), (1024, 40, 512, 16), (24, 33, 8, 16)):
        a = rng.integers(0, 1 << 16, (k, n), dtype=np.uint16)
        flat = trans_layout(a, lanes, group)
        assert flat.size == k * n and np.array_equal(trans_unlayout(flat, k, n, lanes, group), a)
    a = np.arange(32 * 4, dtype=np.uint16).reshape(32, 4)
    assert list(trans_layout(a, 8, 16)[:9]) == [0, 4, 8, 12, 16, 20, 24, 28, 1]   # block 0, column 0, ...


def test_store_e2_loads_round_trip():
    rng = np.random.default_rng(2)
    d, r = 260, 8                        # A: 4 KiB in 2 tiles + a half tail; B: 2 panels + a tail
    a, b = rand_bits(rng, (d, r)), rand_bits(rng, (r, d))
    lay = K.lora_layout(d, r, config=TINY, base=128)
    core = GoldenCore(TINY, lay["end"])
    st = K.lora_store(a, b, lay, config=TINY)
    assert all(k.ok for k in core.run(st.program))
    e2 = K.lora_e2_loads(lay, config=TINY)
    assert all(x is None for _, x in e2.program) and all(dsc.type == DescType.LOAD for dsc, _ in e2.program)
    ga, gb = e2.results(core.run(e2.program))
    assert np.array_equal(ga, a) and np.array_equal(gb, b)


def test_store_tensor_pads_to_granule():
    t = np.arange(1, 41, dtype=np.uint16)         # 80 bytes -> 128 (two 64-byte granules)
    k = K.store_tensor(64, t, config=TINY)
    core = GoldenCore(TINY, 4096)
    core.write(64, np.full(80, 0xFFFF, np.uint16))
    assert all(c.ok for c in core.run(k.program))
    assert np.array_equal(core.read(64, 40), t)
    assert np.all(core.read(144, 24) == 0) and np.all(core.read(192, 8) == 0xFFFF)
    assert k.meta["bytes"] == 128 == K.region_bytes(40, TINY)


@pytest.mark.parametrize("cfg,d,r,batch", [(TINY, 64, 16, 6), (TINY16, 64, 16, 6), (TINY, 260, 8, 5),
                                           (slice_preset(1), 2052, 16, 3)], ids=lambda v: getattr(v, "name", v))
def test_e4_and_e3_bit_exact(cfg, d, r, batch):
    """E4 / E3 through tiles, partials, KEEP and CHAIN panels equal the tile-by-tile reference bit for bit."""
    rng = np.random.default_rng(3)
    a, b = rand_bits(rng, (d, r), d ** -0.5), rand_bits(rng, (r, d), r ** -0.5)
    x = rand_bits(rng, (batch, d))
    lay = K.lora_layout(d, r, config=cfg)
    core = GoldenCore(cfg, lay["end"])
    assert all(c.ok for c in core.run(K.lora_store(a, b, lay, config=cfg).program))
    e4 = K.lora_e4(x, lay, config=cfg)
    m = e4.results(core.run(e4.program))
    m_ref = ref_xa(x, a, cfg, lay)
    assert np.array_equal(m, m_ref)
    e3 = K.lora_e3(x, lay, config=cfg)
    y = e3.results(core.run(e3.program))
    assert y.shape == (batch, d) and np.array_equal(y, ref_mb(m_ref, b, cfg, lay))
    e3one = K.lora_e3(x[0], lay, config=cfg)
    assert np.array_equal(e3one.results(core.run(e3one.program)), y[0])
    xf = x.view(np.float16).astype(np.float64)
    ref = xf @ a.view(np.float16).astype(np.float64)
    err = np.abs(m.view(np.float16).astype(np.float64) - ref).max() / np.abs(ref).max()
    assert err < (1e-3 if cfg.acc == "fp32" else 2e-2)


# ---- attention ---------------------------------------------------------------------------------------------

def device_partials(q_s, k, v, splits, cfg):
    """attention_integral on one golden core per share of the sequence; partials keyed (device, tile)."""
    out, pos = [], 0
    rows = 1 if q_s.ndim == 1 else q_s.shape[0]
    for dev, n in enumerate(splits):
        hd = k.shape[1]
        kv = K.kv_layout(hd, n, config=cfg, rows=rows)
        core = GoldenCore(cfg, kv["end"])
        assert all(c.ok for c in core.run(K.kv_store(k[pos:pos + n], v[pos:pos + n], kv, config=cfg).program))
        att = K.attention_integral(q_s, kv, config=cfg)
        out += [((dev, t), *p) for t, p in enumerate(att.results(core.run(att.program)))]
        pos += n
    return out


def make_qkv(seed, hd, seq, rows=None):
    rng = np.random.default_rng(seed)
    q = rand_bits(rng, hd if rows is None else (rows, hd))
    return q, rand_bits(rng, (seq, hd)), rand_bits(rng, (seq, hd))


def norm_err(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("cfg", [TINY, TINY16], ids=lambda c: c.acc)
def test_merge_order_independent_and_accurate(cfg):
    q, k, v = make_qkv(4, 32, 256)
    parts = device_partials(prepare_query(q), k, v, [64, 64, 64, 64], cfg)
    assert len(parts) == 8                        # 4 devices x 2 token tiles
    base = merge_partials(parts)
    assert base.dtype == np.float32 and base.shape == (32,)
    rng = np.random.default_rng(5)
    for perm in list(itertools.permutations(range(len(parts))))[:24:5] + [tuple(rng.permutation(len(parts)))]:
        assert np.array_equal(merge_partials([parts[i] for i in perm]).view(np.uint32), base.view(np.uint32))
    assert np.array_equal(merge_partials({p[0]: p[1:] for p in reversed(parts)}).view(np.uint32),
                          base.view(np.uint32))
    ref = reference_attention(q, k, v)
    bound = 5e-3 if cfg.acc == "fp32" else 2e-2     # measured in docs/ndp_kernels.md
    assert norm_err(base, ref) < bound


def test_multi_device_split_matches_single_device():
    q, k, v = make_qkv(6, 32, 256)
    qs = prepare_query(q)
    single = merge_partials(device_partials(qs, k, v, [256], TINY_BIG))
    ref = reference_attention(q, k, v)
    for splits in ([64] * 4, [128, 64, 64], [8] * 32):
        multi = merge_partials(device_partials(qs, k, v, splits, TINY_BIG))
        assert norm_err(multi, single) < 2e-3, splits         # both within FP16 rounding of each other
        assert norm_err(multi, ref) < 5e-3


def test_single_partial_is_o_over_sum_and_gqa_group():
    q, k, v = make_qkv(7, 16, 64, rows=3)
    qs = prepare_query(q)
    parts = device_partials(qs, k, v, [32, 32], TINY)
    assert parts[0][1].shape == (3, 16) and parts[0][2].shape == (3,) and parts[0][3].dtype == np.uint32
    out = merge_partials(parts)
    assert out.shape == (3, 16) and norm_err(out, reference_attention(q, k, v)) < 5e-3
    _, o, m, s = parts[0]
    one = merge_partials([parts[0]])
    assert np.array_equal(one, (o.view(np.float16).astype(np.float32) / s.view(np.float32)[:, None]))
    assert to_fp16_bits(one).dtype == np.uint16


def test_merge_bad_arguments():
    o, m, s = np.zeros(8, np.uint16), np.uint16(0), np.float32(1).view(np.uint32)
    with pytest.raises(ValueError, match="at least one"):
        merge_partials([])
    with pytest.raises(ValueError, match="distinct"):
        merge_partials([(0, o, m, s), (0, o, m, s)])
    with pytest.raises(ValueError, match="uint32"):
        merge_partials([(0, o, m, np.uint16(1))])
    with pytest.raises(ValueError, match="sum > 0"):
        merge_partials([(0, o, m, np.uint32(0))])
    with pytest.raises(ValueError, match="key, o_bits"):
        merge_partials([(o, m, s)])


def test_batch_chunk_bisection_equals_linear_search():
    """kernels._max_batch bisects over batches >= 2; a linear search from the top finds the same batch on the
    LoRA shapes of both presets (and a broken monotonicity would show as a difference)."""
    import itertools
    from dataclasses import replace
    from hdl.ndp.config import PAPER
    from firmware.ndp import kernels as K
    from hdl.ndp.descriptor import ErrorCode

    def linear(config, steps, total):
        for b in range(min(total, config.max_batch), 0, -1):
            try:
                descs = steps(b)
            except ValueError:
                continue
            if all(d.validate(config) == ErrorCode.OK for d in descs):
                return b
        return 0

    seen = set()
    for cfg, dims in ((TINY, (64, 256, 688)), (PAPER, (768, 4096, 14336))):
        big = replace(cfg, device_bytes=1 << 62)
        for d, r in itertools.product(dims, (8, 16, 128)):
            lay = K.lora_layout(d, r, config=big)
            for keep in (False, True):
                def steps(b, lay=lay, keep=keep):
                    tail = [K._mm(a, b, lay["r"], n1 - n0, chain=True) for a, n0, n1 in lay["b"]] if keep else []
                    return K._a_tiles(lay, b, last_keep=keep) + tail
                for total in (1, 5, 1000):
                    got = K._max_batch(cfg, steps, total)
                    assert got == linear(cfg, steps, total), (cfg.name, d, r, keep, total)
                    seen.add(got)
    assert len(seen) > 2          # the shapes exercise several chunk sizes, not only the cap
