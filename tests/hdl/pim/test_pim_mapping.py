"""KV mapping (hdl/pim/mapping.py): bijectivity, round trips, the L3 section 4.2 example, burst format, errors."""

import numpy as np
import pytest

from hdl.pim import mapping as m
from hdl.pim.config import PAPER, TINY
from sim.dram.device import flat_burst_address

CONFIGS = [PAPER, TINY]


def _all_elements(cfg, L, which, row0):
    t, i = np.meshgrid(np.arange(L), np.arange(cfg.head_dim), indexing="ij")
    f = m.k_element_location if which == "k" else m.v_element_location
    bg, bank, row, col, chip, j = f(cfg, t.ravel(), i.ravel(), row0)
    return np.stack([bg, bank, row, col, chip, j], axis=1)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_bijective_locations(cfg):
    L = 300
    lay = m.head_layout(cfg, L, 2)
    locs = np.concatenate([_all_elements(cfg, L, w, r0) for h in range(2)
                           for w, r0 in (("k", lay.k_row0[h]), ("v", lay.v_row0[h]))])
    assert len(np.unique(locs, axis=0)) == len(locs) == 4 * L * cfg.head_dim
    assert locs[:, 2].max() < lay.rows_used


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_reads_cover_every_element_once(cfg):
    """score_reads / context_reads agree with k_location / v_location and visit each (token, burst) once."""
    L = 77
    B, bpt = cfg.banks, cfg.bursts_per_token
    for reads, loc, row0 in ((m.score_reads(cfg, L, 3), m.k_location, 3), (m.context_reads(cfg, L, 5), m.v_location, 5)):
        tok, kk = reads.token[reads.valid], reads.burst[reads.valid]
        assert len(set(zip(tok.tolist(), kk.tolist()))) == len(tok) == L * bpt
        n_idx, b_idx = np.nonzero(reads.valid)
        bg, bank, row, col = loc(cfg, tok, 0, kk, row0)
        bpg = cfg.dram.org.banks_per_group
        assert np.array_equal(bg * bpg + bank, b_idx)
        assert np.array_equal(row, reads.row[n_idx]) and np.array_equal(col, reads.col[n_idx])
    assert len(m.score_reads(cfg, L)) == -(-L // B) * bpt
    assert len(m.context_reads(cfg, L)) == -(-L // cfg.token_sets)


def test_paper_example_section_4_2():
    cfg = PAPER  # 16 banks, d = 128 -> 4 bursts per token per chip, 4 token sets
    # Score: tokens 0..15 sit in banks 0..15 at the same row / column; one RD_AB reads burst k of all of them.
    locs = [m.k_location(cfg, t, 0, 0) for t in range(16)]
    assert {(r, c) for _, _, r, c in locs} == {(0, 0)}
    assert sorted(bg * 4 + b for bg, b, _, _ in locs) == list(range(16))
    assert m.k_location(cfg, 16, 0, 0)[2:] == (0, 4)  # next slot: next bpt columns
    # Context: token 0's four slices in banks 0-3, token 1's in banks 4-7 (same column); token 4 (the next
    # token of set 0) at the next column of banks 0-3 ("first burst transfer of tokens 0 and 4").
    banks = lambda t: [bg * 4 + b for bg, b, _, _ in (m.v_location(cfg, t, 0, k) for k in range(4))]
    assert banks(0) == [0, 1, 2, 3] and banks(1) == [4, 5, 6, 7] and banks(4) == [0, 1, 2, 3]
    assert m.v_location(cfg, 0, 0, 0)[2:] == (0, 0) and m.v_location(cfg, 4, 0, 0)[2:] == (0, 1)
    r = m.context_reads(cfg, 8)
    assert r.token[0].tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert r.burst[0].tolist() == [0, 1, 2, 3] * 4


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_image_round_trip_and_padding(cfg):
    rng = np.random.default_rng(1)
    L, H = 45, 2
    lay = m.head_layout(cfg, L, H, rank=1, row_base=1)
    K = rng.standard_normal((H, L, cfg.head_dim)).astype(np.float16).view(np.uint16)
    V = rng.standard_normal((H, L, cfg.head_dim)).astype(np.float16).view(np.uint16)
    img = m.kv_store_image(cfg, K, V, lay)
    n = H * (len(m.score_reads(cfg, L)) + len(m.context_reads(cfg, L))) * cfg.banks
    assert len(img) == n  # every burst the kernel reads, padding included
    K2, V2 = m.kv_from_image(cfg, img, lay)
    assert np.array_equal(K2, K) and np.array_equal(V2, V)
    # K: token 44's burst 0 (bank 44 mod 16 = 12) holds elements c E .. c E + 3 of chip c
    org = cfg.dram.org
    bg, b, row, col = m.k_location(cfg, 44, 0, 0, lay.k_row0[0])
    el = m.unpack_rank_bursts(cfg, [img[flat_burst_address(org, 1, bg, b, row, col)]])[0]
    E = cfg.elems_per_chip
    assert np.array_equal(el, np.stack([K[0, 44, c * E:c * E + 4] for c in range(cfg.chips)]))
    # padding tokens (45..47 of slot 2) are zero bursts
    bg, b, row, col = m.k_location(cfg, 47, 0, 1, lay.k_row0[1])
    assert img[flat_burst_address(org, 1, bg, b, row, col)] == 0
    assert min(r for r in m.score_reads(cfg, L, lay.k_row0[0]).row) == 1


def test_burst_format_bytes():
    """Chip c's element j = its byte lane of beats 2j (low) and 2j + 1 (high)."""
    cfg = PAPER
    e = np.zeros((8, 4), np.uint16)
    e[3, 2] = 0xA1B2
    x = m.pack_rank_bursts(cfg, e)[0]
    C = 8
    assert (x >> ((2 * 2) * C * 8 + 8 * 3)) & 0xFF == 0xB2
    assert (x >> ((2 * 2 + 1) * C * 8 + 8 * 3)) & 0xFF == 0xA1
    assert x & ~((0xFF << (4 * C * 8 + 24)) | (0xFF << (5 * C * 8 + 24))) == 0
    # host view (before re-layout): pair j holds chips 0..C-1's element j as consecutive FP16
    h = m.host_write_bursts(cfg, e)[0]
    assert (h >> (16 * (2 * C + 3))) & 0xFFFF == 0xA1B2 and h & ~(0xFFFF << (16 * (2 * C + 3))) == 0


def test_errors():
    with pytest.raises(ValueError, match=r"at most heads = 1 for L = 1024, at most L = 256 for heads = 3"):
        m.head_layout(TINY, 1024, 3)
    with pytest.raises(ValueError, match=r"L = 4096 exceeds the rank PU buffer.*2048"):
        m.head_layout(TINY, 4096, 1)
    with pytest.raises(ValueError, match="heads"):
        m.head_layout(PAPER, 64, 0)
    with pytest.raises(ValueError, match="L \\(tokens\\)"):
        m.score_reads(PAPER, 0)
    with pytest.raises(ValueError, match="chip"):
        m.k_location(PAPER, 0, 8, 0)
    with pytest.raises(ValueError, match="k must be in"):
        m.v_location(PAPER, 0, 0, 4)
    with pytest.raises(ValueError, match="org.rows"):
        m.score_reads(TINY, 2048, k_row0=10)
    with pytest.raises(ValueError, match="K and V"):
        m.kv_store_image(TINY, np.zeros((5, 32)), np.zeros((5, 32)), m.head_layout(TINY, 6, 1))


def test_flat_burst_address_equals_the_device_models():
    """hdl/pim/mapping keeps its own copy of the device model's flat burst address (hdl/ imports nothing from
    sim/): both must agree on every field."""
    import numpy as np
    from hdl.pim.mapping import flat_burst_address as here
    from sim.dram.device import flat_burst_address as device
    from sim.pim.fused import micro
    for org in (PAPER.dram.org, TINY.dram.org, micro(8).dram.org):
        rng = np.random.default_rng(1)
        for _ in range(200):
            a = (int(rng.integers(org.ranks)), int(rng.integers(org.bank_groups)),
                 int(rng.integers(org.banks_per_group)), int(rng.integers(org.rows)),
                 int(rng.integers(org.bursts_per_row)))
            assert here(org, *a) == device(org, *a)
