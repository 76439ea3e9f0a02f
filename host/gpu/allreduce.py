"""All-reduce times from the measured NCCL profiles in data/vidur/profiling/network.

For each worker count the measured medians (inside one node: rows whose ``devices_per_node`` equals
``min(num_workers, max_devices_per_node)``) are made monotone in the message size (isotonic regression: a
larger message never takes less time; the raw medians jitter by a few microseconds) and interpolated linearly in
log(size). Below the smallest measured size the smallest size's time applies (latency-bound); above the largest,
time grows linearly with the bus bandwidth of the largest quarter of the sizes. Worker counts that were not
measured use the nearest measured count above (or the largest), scaled by the ring all-reduce traffic factor
``2 (n - 1) / n``.

Floor: a ring all-reduce at the datasheet NVLink bandwidth per direction (host.link presets), no latency.
"""

from functools import lru_cache

import numpy as np

from host.gpu.profiles import DATA_DIR

__all__ = ["AllReduceModel", "NETWORK_PROFILES", "isotonic_increasing"]


def isotonic_increasing(y) -> np.ndarray:
    """Least-squares non-decreasing fit of the sequence ``y`` (pool-adjacent-violators)."""
    vals, weights, counts = [], [], []
    for v in np.asarray(y, dtype=np.float64):
        vals.append(v), weights.append(1.0), counts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            w = weights[-2] + weights[-1]
            v = (vals[-2] * weights[-2] + vals[-1] * weights[-1]) / w
            c = counts[-2] + counts[-1]
            del vals[-1], weights[-1], counts[-1]
            vals[-1], weights[-1], counts[-1] = v, w, c
    return np.repeat(vals, counts)

NETWORK_PROFILES = {"a100": DATA_DIR / "vidur" / "profiling" / "network" / "a100_dgx" / "all_reduce.csv",
                    "h100": DATA_DIR / "vidur" / "profiling" / "network" / "h100_dgx" / "all_reduce.csv"}


class AllReduceModel:
    """Measured all-reduce of one node type; :meth:`time` is vectorized over message bytes."""

    def __init__(self, curves: dict, link_bw_gbps: float, name: str = ""):
        # curves: n_workers -> (sizes bytes ascending, times s monotone)
        if not curves:
            raise ValueError("AllReduceModel needs at least one measured worker count")
        self.curves = curves
        self.link_bw_gbps = link_bw_gbps
        self.name = name
        self._tail_bw = {}
        for n, (s, t) in curves.items():
            k = max(2, len(s) // 4)
            ds, dt = s[-1] - s[-k], t[-1] - t[-k]
            self._tail_bw[n] = ds / dt if dt > 0 else s[-1] / t[-1]

    @classmethod
    @lru_cache(maxsize=None)
    def for_gpu(cls, gpu: str) -> "AllReduceModel":
        import csv
        import statistics
        from host.models.hardware import NODES
        try:
            path = NETWORK_PROFILES[gpu]
        except KeyError:
            raise ValueError(f"no measured all-reduce profile for GPU {gpu!r}; available: "
                             f"{sorted(NETWORK_PROFILES)}") from None
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["collective"] == "all_reduce"]
        max_dpn = max(int(r["max_devices_per_node"]) for r in rows)
        by_n = {}
        for r in rows:
            n = int(r["num_workers"])
            if int(r["devices_per_node"]) == min(n, max_dpn):
                by_n.setdefault(n, {}).setdefault(float(r["size"]), []).append(
                    float(r["time_stats.all_reduce.median"]) * 1e-3)
        curves = {}
        for n, pts in by_n.items():
            sizes = np.array(sorted(pts))
            times = isotonic_increasing([statistics.median(pts[s]) for s in sizes])
            curves[n] = (sizes, times)
        link = next(node.gpu_link.bw_gbps for node in NODES.values() if node.gpu.name == gpu)
        return cls(curves, link, name=f"{gpu} ({path.parent.name})")

    def _curve_time(self, n: int, nbytes: np.ndarray) -> np.ndarray:
        s, t = self.curves[n]
        out = np.interp(np.log(np.maximum(nbytes, s[0])), np.log(s), t)
        over = nbytes > s[-1]
        if np.any(over):
            out = np.where(over, t[-1] + (nbytes - s[-1]) / self._tail_bw[n], out)
        return out

    def time(self, nbytes, n_workers: int):
        from host.gpu.model import OpTime
        if n_workers < 1:
            raise ValueError(f"all-reduce n_workers must be >= 1, got {n_workers}")
        nbytes = np.asarray(nbytes, dtype=np.float64)
        if n_workers == 1:
            z = np.zeros_like(nbytes)
            return OpTime(float(z) if z.ndim == 0 else z, float(z) if z.ndim == 0 else z)
        if n_workers in self.curves:
            cal = self._curve_time(n_workers, nbytes)
        else:
            above = [n for n in sorted(self.curves) if n > n_workers]
            ref = above[0] if above else max(self.curves)
            scale = (2 * (n_workers - 1) / n_workers) / (2 * (ref - 1) / ref)
            cal = self._curve_time(ref, nbytes * scale)
        cal = np.where(nbytes > 0, cal, 0.0)
        floor = 2 * (n_workers - 1) / n_workers * nbytes / (self.link_bw_gbps * 1e9)
        return OpTime(float(cal) if cal.ndim == 0 else cal, float(floor) if floor.ndim == 0 else floor)
