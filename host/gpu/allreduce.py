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

__all__ = ["AllReduceModel", "NETWORK_PROFILES"]

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
        from sklearn.isotonic import IsotonicRegression
        import pandas as pd
        from host.models.hardware import NODES
        try:
            path = NETWORK_PROFILES[gpu]
        except KeyError:
            raise ValueError(f"no measured all-reduce profile for GPU {gpu!r}; available: "
                             f"{sorted(NETWORK_PROFILES)}") from None
        df = pd.read_csv(path)
        df = df[df["collective"] == "all_reduce"]
        max_dpn = int(df["max_devices_per_node"].max())
        curves = {}
        for n, g in df.groupby("num_workers"):
            g = g[g["devices_per_node"] == min(int(n), max_dpn)]
            if g.empty:
                continue
            g = g.groupby("size")["time_stats.all_reduce.median"].median().sort_index()
            sizes = g.index.to_numpy(np.float64)
            times = IsotonicRegression().fit_transform(np.log(sizes), g.to_numpy(np.float64) * 1e-3)
            curves[int(n)] = (sizes, times)
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
