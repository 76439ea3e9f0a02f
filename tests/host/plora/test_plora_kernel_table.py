"""The calibrated NDP model's precomputed kernel table (data/ndp_kernel_table.json, host/plora/kernel_table.py):
current for the committed model and sources, equal to the model on a sample of its entries, and never read when
the model or a source changed."""

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

import sim.perf.ndp as ndp
from firmware.ndp.kernels import load_chunk_bytes
from sim.perf.ndp import NDPPerfModel, TABLE_PATH, TABLE_SOURCES, table_fingerprint, load_kernel_table


@pytest.fixture
def fresh(monkeypatch):
    """Empty process-wide kernel caches, so a model computes what it is asked."""
    monkeypatch.setattr(ndp, "_KERNEL_CACHES", {})
    monkeypatch.setattr(ndp, "_TABLES_LOADED", {})


def _doc():
    return json.loads(TABLE_PATH.read_text())


def test_committed_table_is_current(fresh):
    doc = _doc()
    m = NDPPerfModel.paper(table=None)
    assert doc["fingerprint"] == table_fingerprint(m), (
        "data/ndp_kernel_table.json is stale: the NDP model, the firmware or the core changed since it was "
        "written; write it again with `ndpim plora kernel-table`")
    assert doc["sources"] == list(TABLE_SOURCES)
    kinds = {k[0] for k, _ in doc["entries"]}
    assert {"e3", "e4", "att", "attention", "load"} <= kinds, kinds
    assert load_kernel_table(m) == f"loaded {len(doc['entries'])}"


def _sample(entries, per_kind=3, seed=0):
    """The cheapest ``per_kind`` entries of each kind (smallest shapes) and one drawn at random per kind."""
    by = {}
    for k, v in entries:
        by.setdefault(k[0], []).append((k, v))
    rng = np.random.default_rng(seed)
    out = []
    for kind, rows in sorted(by.items()):
        rows.sort(key=lambda kv: float(np.prod([abs(x) + 1 for x in np.ravel(kv[0][1:]).astype(float)])))
        pick = rows[:per_kind] + [rows[int(rng.integers(per_kind, len(rows)))]] if len(rows) > per_kind else rows
        out += pick
    return out


def _mismatches(entries):
    """Entries whose value differs from the model's, recomputed from scratch (no table, empty caches)."""
    ndp._KERNEL_CACHES.clear()
    m = NDPPerfModel.paper(table=None)
    assert not m._kcache
    bad = []
    for key, v in entries:
        k = ndp._dec(key)
        if k[0] == "att":
            got = m._attention_cycles(*k[1:])
        elif k[0] == "att_inc":
            got = m._attention_inc(*k[1:])
        elif k[0] == "attg":
            got = m._attg_cycles(*k[1:])
        elif k[0] == "attg_inc":
            got = m._attg_inc(*k[1:])
        elif k[0] == "load":
            full, rest = k[1:]
            per = load_chunk_bytes(m.config)
            m.load_s(full * per + rest)
            got = m._kcache[k]
        else:
            got = m.kernel_cycles(k[0], *k[1])
        if got != v:
            bad.append((k, got, v))
    return bad


def test_table_entries_equal_the_model(fresh):
    """Sampled entries (every kernel kind) recomputed from scratch: bit-equal; a changed entry is caught."""
    sample = _sample(_doc()["entries"])
    assert len({k[0] for k, _ in sample}) >= 5
    assert _mismatches(sample) == []
    broken = [list(e) for e in sample]
    broken[-1][1] *= 1.0001
    assert [b[0] for b in _mismatches(broken)] == [ndp._dec(broken[-1][0])]


def test_loaded_table_is_what_the_model_answers(fresh, tmp_path):
    """A table with the model's fingerprint seeds its cache: its (here: altered) value is the answer."""
    m = NDPPerfModel.paper(table=None)
    key = ["e4", [4096, 16, 1]]
    fake = 12345.0
    ndp.write_kernel_table(m, [[key, fake]], tmp_path / "t.json")
    ndp._KERNEL_CACHES.clear()
    m2 = NDPPerfModel.paper(table=tmp_path / "t.json")
    assert m2.table_status == "loaded 1"
    assert m2.lora_e4_s(4096, 16, 1) == fake / m2.hz


def test_stale_table_is_not_read(fresh, tmp_path):
    m = NDPPerfModel.paper(table=None)
    ndp.write_kernel_table(m, [[["e4", [4096, 16, 1]], 12345.0]], tmp_path / "t.json")
    # another calibration: another fingerprint
    other = NDPPerfModel(m.config, m.memory, replace(m.cal, gap=m.cal.gap + 1.0))
    with pytest.warns(RuntimeWarning, match="stale"):
        assert load_kernel_table(other, tmp_path / "t.json") == "stale"
    assert not other._kcache
    assert load_kernel_table(other, tmp_path / "missing.json") == "missing"


def test_fingerprint_follows_every_source(fresh, tmp_path, monkeypatch):
    """Changing one byte of any file of TABLE_SOURCES changes the fingerprint."""
    for rel in TABLE_SOURCES:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ndp.ROOT / rel, tmp_path / rel)
    m = NDPPerfModel.paper(table=None)
    monkeypatch.setattr(ndp, "ROOT", tmp_path)
    base = table_fingerprint(m)
    assert base == table_fingerprint(NDPPerfModel.paper(table=None))
    for rel in TABLE_SOURCES:
        p = tmp_path / rel
        b = p.read_bytes()
        p.write_bytes(b + b" ")
        assert table_fingerprint(m) != base, rel
        p.write_bytes(b)
    assert table_fingerprint(m) == base
