"""The hidden truth of the simulated device: the time every call takes on it before noise,
and so the exact total of any bucket list on any batch sequence.

Built from a recorded calibration (core.plan.calibration.Calibration): its interpolated
medians are the smooth base of each curve (a bucket's graph, a batch's eager forward and
its breaks), and each curve departs from its base by a roughness field, a fresh value every
`rough_step` tokens (linear between them) of relative sd `rough_sd` (seeded: the world a
simulated run lives in). The recorded rows are a sample of one world; the truth is another
world of the same smoothness and roughness, so what a calibration on the simulated device
measures at its sizes is the truth there plus noise, and what it interpolates between them
carries the roughness as real error.

The truth is what a list costs in the median process (level shift 0, the host at its median
speed), with captures at their mean (no offset), and no per-call noise: the statistic
bcgtune's predictions estimate (a sum of per-batch medians) and the time a server's average
run spends. Pure numpy; no torch.
"""

from __future__ import annotations

import numpy as np

from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.engines.sim.noise import NoiseProfile

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a well-mixed 64-bit value per input (counter-based draws)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def lattice_normals(seed: int, stream: int, k: np.ndarray) -> np.ndarray:
    """A standard normal value per lattice index k, the same for the same (seed, stream, k)
    whatever else is asked: an unbounded field without an array."""
    k = np.asarray(k, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = np.uint64((int(seed) * 0x9E3779B97F4A7C15 + int(stream) * 0xD1B54A32D192ED03) & 0xFFFFFFFFFFFFFFFF)
        a = _mix64(k * np.uint64(2) + base)
        b = _mix64(k * np.uint64(2) + np.uint64(1) + base)
    u1 = ((a >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    u2 = ((b >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def _spread_curve(sizes, sd_rel, fallback: float):
    """A per-size relative sd as a function of size: the recorded sds (medians over a log-size
    window, so one odd size does not set its neighbours'), flat beyond their ends."""
    s = np.asarray(sizes, dtype=np.float64)
    v = np.asarray(sd_rel, dtype=np.float64)
    ok = np.isfinite(v) & (v >= 0) & (s > 0)
    s, v = s[ok], v[ok]
    if s.size == 0:
        return lambda n: np.full(np.shape(n), fallback, dtype=np.float64)
    order = np.argsort(s)
    s, v = s[order], v[order]
    ls = np.log(s)
    smooth = np.array([np.median(v[np.abs(ls - x) <= 0.15]) for x in ls])
    ux, idx = np.unique(ls, return_index=True)
    us = smooth[idx]

    def curve(n):
        return np.interp(np.log(np.maximum(np.asarray(n, dtype=np.float64), 1.0)), ux, us)

    return curve


_P90_NORMAL = 1.2815515655446004


class SimTruth:
    """The true (noise-free, median-process) time of every call of one model on the simulated
    GPU, from the recorded calibration `cal`, in the world `seed`."""

    def __init__(self, cal: Calibration, profile: NoiseProfile, seed: int):
        from dataclasses import replace

        from bcgtune.engines.sim.noise import roughness_of

        own = roughness_of(cal)  # the recording's own roughness, where it is dense enough to tell
        self.cal, self.profile, self.seed = cal, profile if own is None else replace(profile, rough_sd=own), int(seed)
        self.runner = cal.runner
        self._sd_graph, self._sd_replay, self._sd_eager = self._spreads(cal, profile)
        self._calls: dict[tuple, tuple[float, float, float]] = {}

    def call(self, kind: str, n: int, r: int = 1, b: int = 0) -> tuple[float, float, float]:
        """(true ms, relative sd, host share) of one call, kept once computed: `kind`
        "segments" (bucket b's graph alone), "replay" (n tokens from r requests in bucket b:
        the true time without the graph's capture offset, returned as (graph ms, sd, breaks
        ms)) or "eager" (n, r: returned as (eager ms, sd, the device's own work in it ms))."""
        key = (kind, n, r, b)
        got = self._calls.get(key)
        if got is None:
            if kind == "segments":
                got = (float(self.graph_ms(b)), float(self.sd_graph(b)), 0.0)
            elif kind == "replay":
                got = (float(self.graph_ms(b)), float(self.sd_replay(n)), float(self.breaks_ms(n, r)))
            else:
                got = (float(self.eager_ms(n, r)), float(self.sd_eager(n)), float(self.device_ms(n, r)))
            self._calls[key] = got
        return got

    # ---- the curves ------------------------------------------------------------------
    def _rough(self, stream: int, n) -> np.ndarray:
        """1 + the roughness field `stream` at token counts n."""
        step = max(1, int(self.profile.rough_step))
        x = np.asarray(n, dtype=np.float64) / step
        k = np.floor(x)
        f = x - k
        ki = np.maximum(k, 0).astype(np.int64)
        z = (1.0 - f) * lattice_normals(self.seed, stream, ki) + f * lattice_normals(self.seed, stream, ki + 1)
        return np.maximum(1.0 + self.profile.rough_sd * z, 0.5)

    def graph_ms(self, b) -> np.ndarray:
        """A bucket's graph: its segments alone (breakable) or the whole forward (full)."""
        b = np.asarray(b, dtype=np.float64)
        return np.asarray(self.cal.graph_time(b), dtype=np.float64) * self._rough(1, b)

    def breaks_ms(self, n, r) -> np.ndarray:
        """What a breakable replay of a batch costs beyond its bucket's segments (0 on full)."""
        if self.runner == "full":
            return np.zeros(np.broadcast_shapes(np.shape(n), np.shape(r)))
        return np.asarray(self.cal.break_time(n, r), dtype=np.float64) * self._rough(2, n)

    def eager_ms(self, n, r) -> np.ndarray:
        """A batch run eagerly, the host at its median speed."""
        r = 1 if self.runner == "full" else r
        return np.asarray(self.cal.eager_time(n, r), dtype=np.float64) * self._rough(3, n)

    @property
    def launch_ms(self) -> float:
        """The host's time to launch one eager forward (its kernels, whatever the batch's
        size): the recording's smallest eager time, where a forward waits on its launches."""
        got = getattr(self, "_launch", None)
        if got is None:
            bt = self.cal.batches
            eager = bt.eager_ms if self.runner == "breakable" and bt is not None else self.cal._eager_column()
            got = self._launch = float(np.min(eager))
        return got

    def device_ms(self, n, r) -> np.ndarray:
        """The device's own work in an eager forward of the batch: a replay of it in a bucket
        of its size (segments and breaks; the whole forward on full)."""
        return self.graph_ms(n) + self.breaks_ms(n, r)

    def host_share(self, n, r) -> np.ndarray:
        """The part of an eager forward's time that waits on the host's launches: the launch
        time where it exceeds the device's work, as a share of eager's time (else 0)."""
        eager = np.maximum(self.eager_ms(n, r), 1e-9)
        dev = self.device_ms(n, r)
        return np.where(self.launch_ms > dev, np.minimum(self.launch_ms / eager, 1.0), 0.0)

    def eager_at_host(self, n: int, r: int, host: float) -> float:
        """An eager forward's true time with the host at `host` x its median speed's time:
        the launches take launch_ms x host, and the forward ends when both they and the
        device's work are done (eager's recorded excess over either kept as it is)."""
        e = float(self.eager_ms(n, r))
        dev = float(self.device_ms(n, r))
        return e + max(self.launch_ms * host, dev) - max(self.launch_ms, dev)

    # ---- per-call spread ---------------------------------------------------------------
    @staticmethod
    def _spreads(cal: Calibration, profile: NoiseProfile):
        """Relative sd per call of (a graph alone, a replay, an eager forward), as functions
        of size: from the calibration's kept rounds, else its recorded p10-p90 spreads, else
        the profile's."""
        meta = cal.meta if isinstance(cal.meta, dict) else {}
        t = cal.tokens
        if cal.graph_rounds is not None and cal.rounds >= 3:
            g_sd = _mad_sd(cal.graph_rounds) / np.maximum(cal.graph_ms, 1e-9)
        else:
            spread = meta.get("segments_spread") if cal.runner == "breakable" else None
            g_sd = _p10_p90_sd(spread, t, cal.graph_ms, "graph_p10_p90" if cal.runner == "full" else None, meta)
        graph = _spread_curve(t, g_sd, profile.graph_sd)
        bt = cal.batches
        if cal.runner == "breakable" and bt is not None:
            if bt.eager_rounds is not None and bt.eager_rounds.shape[1] >= 3:
                e_sd = _mad_sd(bt.eager_rounds) / np.maximum(bt.eager_ms, 1e-9)
                r_sd = None
            else:
                bs = meta.get("batches_spread")
                e_sd, r_sd = _batch_spreads(bs if isinstance(bs, dict) else {}, bt)
            eager = _spread_curve(bt.tokens, e_sd, profile.eager_sd)
            replay = graph if r_sd is None else _spread_curve(bt.tokens, r_sd, profile.graph_sd)
        else:
            e_sd = (
                _mad_sd(cal.eager_rounds) / np.maximum(cal._eager_column(), 1e-9)
                if cal.eager_rounds is not None and cal.rounds >= 3
                else _p10_p90_sd(None, t, cal.eager_ms, "eager_p10_p90", meta)
            )
            eager = _spread_curve(t, e_sd, profile.eager_sd)
            replay = graph
        return graph, replay, eager

    def sd_graph(self, b) -> np.ndarray:
        return self._sd_graph(b)

    def sd_replay(self, n) -> np.ndarray:
        return self._sd_replay(n)

    def sd_eager(self, n) -> np.ndarray:
        return self._sd_eager(n)

    # ---- exact totals --------------------------------------------------------------------
    def batch_ms(self, tokens, requests, buckets, factor: float = DEFAULT_PADDING_FACTOR) -> np.ndarray:
        """Each batch's true time under a bucket list (SGLang's replay rule; [] runs all eager)."""
        tok = np.asarray(tokens, dtype=np.int64)
        req = np.ones_like(tok) if self.runner == "full" else np.asarray(requests, dtype=np.int64)
        bl = np.unique(np.asarray(list(buckets), dtype=np.int64))
        eager = self.eager_ms(tok, req)
        if not bl.size:
            return eager
        chosen, replay = assign_buckets(tok, bl, factor)
        graph = self.graph_ms(np.where(replay, chosen, 1))
        return np.where(replay, graph + self.breaks_ms(tok, req), eager)

    def total_ms(self, tokens, requests, buckets, factor: float = DEFAULT_PADDING_FACTOR) -> float:
        """The exact true total of a batch sequence under a bucket list (ms)."""
        return float(self.batch_ms(tokens, requests, buckets, factor).sum())

    # ---- what a capture costs ------------------------------------------------------------
    def capture_s(self, b: int, warmup: int) -> float:
        """Seconds to capture bucket b: as the recording timed it (interpolated), else its
        warm-up forwards and the capture itself."""
        got = self.cal.capture_s_of([int(b)])
        if got is not None:
            return float(got)
        return (max(1, warmup) + 1) * float(self.graph_ms(b)) / 1e3 + self.profile.capture_extra_s

    def pool_gib(self, largest: int, graphs: int) -> float:
        """Graph memory of `graphs` graphs whose largest is `largest` (0 where the recording
        kept no memory)."""
        if not self.cal.has_memory:
            return 0.0
        return float(self.cal.pool_gib_at(int(largest)) + max(0, graphs - 1) * (self.cal.per_graph_gib or 0.0))


def _mad_sd(rounds: np.ndarray) -> np.ndarray:
    """The sd of each row's rounds, robustly (1.4826 x the median absolute deviation)."""
    r = np.asarray(rounds, dtype=np.float64)
    med = np.median(r, axis=1, keepdims=True)
    return 1.4826 * np.median(np.abs(r - med), axis=1)


def _p10_p90_sd(spread, tokens, medians, key: str | None, meta: dict) -> np.ndarray:
    """Relative sd per row from recorded p10-p90 spreads (a normal's width, 2 x 1.2816 sd),
    NaN where the recording kept none."""
    out = np.full(np.shape(tokens), np.nan)
    if key is not None:
        spread = meta.get("spread")
    if not isinstance(spread, dict):
        return out
    for i, (t, m) in enumerate(zip(np.asarray(tokens).tolist(), np.asarray(medians).tolist())):
        v = spread.get(str(t))
        if key is not None and isinstance(v, dict):
            v = v.get(key)
        if isinstance(v, list) and len(v) == 2 and m > 0:
            try:
                out[i] = (float(v[1]) - float(v[0])) / (2 * _P90_NORMAL) / m
            except (TypeError, ValueError):
                pass
    return out


def _batch_spreads(bs: dict, bt) -> tuple[np.ndarray, np.ndarray]:
    """Relative sds of each recorded batch's eager forward and its replay."""
    e = np.full(bt.tokens.shape, np.nan)
    r = np.full(bt.tokens.shape, np.nan)
    for i, (n, q) in enumerate(zip(bt.tokens.tolist(), bt.requests.tolist())):
        v = bs.get(f"{n}x{q}")
        if not isinstance(v, dict):
            continue
        try:
            ep, rp, rm = v.get("eager_p10_p90"), v.get("replay_p10_p90"), float(v.get("replay_ms") or 0)
            if isinstance(ep, list) and len(ep) == 2 and bt.eager_ms[i] > 0:
                e[i] = (float(ep[1]) - float(ep[0])) / (2 * _P90_NORMAL) / float(bt.eager_ms[i])
            if isinstance(rp, list) and len(rp) == 2 and rm > 0:
                r[i] = (float(rp[1]) - float(rp[0])) / (2 * _P90_NORMAL) / rm
        except (TypeError, ValueError):
            continue
    return e, r
