"""The execution timeline (host/plora/timeline.py): its FIFO against a plain loop, the repeated-layer shortcut
against computing every layer, and constructed cases where it and the cost model's estimate differ, by how much."""

import numpy as np
import pytest

from conftest import make_cost
from host.plora.cost import WaveSums
from host.plora.timeline import LayerWork, Timeline, fifo

US = 1e-6


def fifo_loop(a, s, free):
    out, f = [], free
    for ai, si in zip(a, s):
        f = max(ai, f) + si
        out.append(f)
    return np.array(out)


def test_fifo_matches_a_plain_loop():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        a = np.sort(rng.uniform(0, 10, n)) if rng.random() < 0.5 else rng.uniform(0, 10, n)
        s = rng.uniform(0, 2, n) * (rng.random(n) < 0.8)
        free = float(rng.uniform(-1, 5))
        np.testing.assert_allclose(fifo(a, s, free), fifo_loop(a, s, free), rtol=0, atol=1e-12)


def test_small_fifo_is_the_vectorized_one():
    """Up to 8 jobs the FIFO runs its operations one by one in Python: bit-equal to the vectorized form."""
    from host.plora.timeline import _fifo_small, _fifo_np
    rng = np.random.default_rng(1)
    for _ in range(500):
        n = int(rng.integers(1, 9))
        a = rng.uniform(0, 10, n) * (rng.random(n) < 0.7)
        s = rng.uniform(0, 2, n) * (rng.random(n) < 0.8)
        free = float(rng.uniform(-1, 5))
        assert _fifo_small(a.tolist(), s.tolist(), free).tolist() == _fifo_np(a, s, free).tolist()


def test_a_reordered_queue_is_caught():
    """The check above is not vacuous: serving the same jobs out of order gives other finish times."""
    a, s = np.array([0.0, 0.0, 5.0]), np.array([3.0, 1.0, 1.0])
    assert not np.allclose(fifo(a, s, 0.0), fifo_loop(a[::-1], s[::-1], 0.0)[::-1])


def _random_work(rng, n_dev):
    nj = int(rng.integers(0, 12))
    return LayerWork(base_s=float(rng.uniform(0, 5)) * US, job_dev=rng.integers(0, n_dev, nj),
                     job_out=rng.uniform(0, 4000, nj), job_s=rng.uniform(0, 3, nj) * US, job_in=rng.uniform(0, 4000, nj),
                     gpu_e1_s=float(rng.uniform(0, 1)) * US, gpu_after_s=float(rng.uniform(0, 1)) * US,
                     att_out=rng.uniform(0, 500, n_dev), att_s=rng.uniform(0, 4, n_dev) * US,
                     att_in=rng.uniform(0, 500, n_dev), att_gpu_s=float(rng.uniform(0, 3)) * US,
                     merge_s=float(rng.uniform(0, 1)) * US, prefill_out=float(rng.uniform(0, 3000)),
                     load_in=float(rng.choice([0.0, rng.uniform(0, 50000)])),
                     host_stop_s=float(rng.choice([0.0, 6.7])) * US, waves=int(rng.integers(1, 3)))


def test_repeated_layers_equal_every_layer_computed():
    """The repeated-layer shortcut against every layer computed; and a sweep's run without trace spans
    (``emit_spans``) executes the same time."""
    rng = np.random.default_rng(1)
    tl = Timeline(3, 1e9, 1000e-9)
    for _ in range(100):
        w = _random_work(rng, 3)
        a, b = tl.run(w, 12), tl.run(w, 12, repeat=False)
        quiet = tl.run(w, 12, spans=False)
        assert quiet.duration_s == a.duration_s and quiet.spans == [] and (a.spans or not a.busy_s["GPU 0"])
        assert a.duration_s == pytest.approx(b.duration_s, rel=1e-12)
        assert a.lora_s == pytest.approx(b.lora_s, rel=1e-9) and a.attention_s == pytest.approx(b.attention_s, rel=1e-9)
        for k in a.busy_s:
            assert a.busy_s[k] == pytest.approx(b.busy_s[k], rel=1e-9, abs=1e-18)
        assert len(a.spans) == len(b.spans)


def _estimate(jobs_out, jobs_in, jobs_dev_s, devs, n_dev=2, host_s=0.0):
    """The cost model's wave estimate (VI-B) of the same jobs: busiest resource + one round trip."""
    c = make_cost(n_dev=n_dev)                    # 1 GB/s, 1 us round trip
    w = WaveSums.empty(n_dev)
    for o, i, d, dev in zip(jobs_out, jobs_in, jobs_dev_s, devs):
        w.add((o, i, d, 0.0, 0.0), dev)
    return c.wave_s(w) + host_s


def test_several_e3_jobs_queued_on_one_device():
    """4 E3 jobs on device 0 (1 kB out, 2 us, 1 kB back each; 1 GB/s, 1 us round trip). The estimate pipelines
    them perfectly: max(link 4 us, device 8 us) + 1 us = 9 us. Executed: the first x must arrive before the device
    starts (1 + 0.5 us) and the last y leaves after it ends (1 + 0.5 us): 11 us, the estimate 18 % short."""
    w = LayerWork(job_dev=np.zeros(4, np.int64), job_out=np.full(4, 1000.0), job_s=np.full(4, 2 * US),
                  job_in=np.full(4, 1000.0))
    ex = Timeline(2, 1e9, 1000e-9).run(w, 1)
    est = _estimate([1000] * 4, [1000] * 4, [2 * US] * 4, [0] * 4)
    assert est == pytest.approx(9 * US)
    assert ex.duration_s == pytest.approx(11 * US)
    assert est / ex.duration_s - 1 == pytest.approx(-2 / 11)
    assert ex.busy_s["device 0"] == pytest.approx(8 * US) and ex.busy_s["device 1"] == 0.0


def test_both_link_directions_loaded():
    """2 jobs on 2 devices, 4 kB each way, 0.1 us of device time. The estimate overlaps the two directions fully:
    max(8, 8, 0.1) + 1 = 9 us. Executed: a job's y cannot leave before its x arrived, so the in direction starts
    4.6 us late: job 0 back at 8.6, job 1's x out at 8, on device 1 at 8.6, back at 12.6 + 0.5 = 13.1 us."""
    w = LayerWork(job_dev=np.array([0, 1]), job_out=np.full(2, 4000.0), job_s=np.full(2, 0.1 * US),
                  job_in=np.full(2, 4000.0))
    ex = Timeline(2, 1e9, 1000e-9).run(w, 1)
    est = _estimate([4000] * 2, [4000] * 2, [0.1 * US] * 2, [0, 1])
    assert est == pytest.approx(9 * US)
    assert ex.duration_s == pytest.approx(13.1 * US)
    assert ex.busy_s["link out"] == pytest.approx(8 * US) and ex.busy_s["link in"] == pytest.approx(8 * US)


def test_host_launch_path_on_the_critical_path():
    """Host-mediated (PLoRA-NoCXL): 3 jobs on 3 devices, each first a 6.7 us kernel stop on the host, one at a
    time. The estimate adds the stops in series to the wave: 3 x 6.7 + max(3, 2) + 1 = 24.1 us. Executed: each
    job's transfer and device work overlap the next job's stop; the last stop ends at 20.1 us, then 1 + 0.5 + 2 +
    1 + 0.5 us: 25.1 us."""
    w = LayerWork(job_dev=np.array([0, 1, 2]), job_out=np.full(3, 1000.0), job_s=np.full(3, 2 * US),
                  job_in=np.full(3, 1000.0), host_stop_s=6.7 * US)
    ex = Timeline(3, 1e9, 1000e-9).run(w, 1)
    est = _estimate([1000] * 3, [1000] * 3, [2 * US] * 3, [0, 1, 2], n_dev=3, host_s=3 * 6.7 * US)
    assert est == pytest.approx(24.1 * US)
    assert ex.duration_s == pytest.approx(25.1 * US)
    assert ex.busy_s["host"] == pytest.approx(3 * 6.7 * US)


def test_host_operations_before_and_after_a_device_job():
    """Host-mediated: 2 operations (1 us each) before the job (the input's copy, the launch), 1 after (the result's
    copy): host 0-2, x out 2-3, on the device 3.5-5.5, the copy 5.5-6.5, y 6.5-7.5, at the GPU 8 us."""
    w = LayerWork(job_dev=np.array([0]), job_out=np.array([1000.0]), job_s=np.array([2 * US]),
                  job_in=np.array([1000.0]), host_stop_s=1 * US, job_stops=np.array([2.0]),
                  job_stops_after=np.array([1.0]))
    ex = Timeline(1, 1e9, 1000e-9).run(w, 1)
    assert ex.duration_s == pytest.approx(8 * US)
    assert ex.busy_s["host"] == pytest.approx(3 * US)


def test_adapter_loads_take_idle_link_time_then_delay_the_end():
    """Loads are lowest priority: 2 layers of 10 us GPU work with an idle link carry 20 kB at 1 GB/s; 30 kB leave
    10 kB after the last layer (10 us more)."""
    tl = Timeline(1, 1e9, 0.0)
    assert tl.run(LayerWork(base_s=10 * US, load_in=20000.0), 2).duration_s == pytest.approx(20 * US)
    assert tl.run(LayerWork(base_s=10 * US, load_in=30000.0), 2).duration_s == pytest.approx(30 * US)


def test_attention_waits_for_the_lora_wave_and_contends_on_the_device():
    """Attention starts when the LoRA wave is done; the device's attention job queues behind nothing then, but
    the partials return through the same link-in FIFO."""
    w = LayerWork(base_s=1 * US, job_dev=np.array([0]), job_out=np.array([1000.0]), job_s=np.array([3 * US]),
                  job_in=np.array([1000.0]), att_out=np.array([500.0]), att_s=np.array([2 * US]),
                  att_in=np.array([500.0]), att_gpu_s=1 * US)
    ex = Timeline(1, 1e9, 1000e-9).run(w, 1)
    wave = 1 + 0.5 + 3 + 1 + 0.5                    # x, latency, job, y, latency
    att = 0.5 + 0.5 + 2 + 0.5 + 0.5                 # q, latency, job, partial, latency
    assert ex.duration_s == pytest.approx((wave + att) * US)
    assert ex.lora_s == pytest.approx(wave * US) and ex.attention_s == pytest.approx(att * US)

