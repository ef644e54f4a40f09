"""Training speed versus node count for data-parallel all-reduce jobs.

Step time model (Optimus' speed function reduced to all-reduce data parallelism, global
batch fixed per job), with Pollux's observation that a single node does no network sync:

    T(n) = t0/n + t1 + t2*n + t3*[n > 1],   t0..t3 >= 0,   throughput f(n) = 1/T(n) steps/s

``t0/n`` is the compute of one global batch split over ``n`` nodes, ``t1`` a fixed
per-step cost (optimizer, data loading, intra-node all-reduce), ``t2*n`` the part of
synchronisation that grows with the number of peers and ``t3`` the fixed cost of the
inter-node all-reduce that starts at 2 nodes.  ``t2 > 0`` lets throughput *fall* beyond
some size, which real tables show.

The smooth fit is a non-negative least squares on *relative* residuals ``(T_obs - T)/T_obs`` with a
ridge toward prior parameters (a MAP estimate under a Gaussian prior): with one observed
size the prior decides the shape, and as more sizes are seen the data outweighs it.  That
is what keeps extrapolation to never-seen sizes safe.  Between sizes actually observed,
``ThroughputFit`` adds the interpolated residual of the smooth curve (see its doc).

Goodput (Pollux, OSDI'21) is optional: ``statistical_efficiency`` turns a reported gradient
noise scale into the fraction of a large batch's samples that still count as progress.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Site default shape of T(n) at the reference size (shares of one step): 80% compute that
# parallelises, 10% fixed, 3% sync growing with n, 7% inter-node sync; throughput then
# peaks at about 5x the reference size.  Documented in the README; see SiteDefaults.
DEFAULT_SHAPE = (0.80, 0.10, 0.03, 0.07)
# Weight of the prior in units of one observed size.  Weak on purpose: it decides the
# shape from one or two sizes and is outweighed once three are seen.
PRIOR_STRENGTH = 0.05
_MIN_T = 1e-9
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
# Rates outside this range (steps/s) are broken reports, not training jobs.
RATE_RANGE = (1e-9, 1e9)
# ``fit_throughput_many`` pads every job's sizes to the widest job of its batch.  While the
# batch is at most this wide, numpy sums each row's few terms in order, so a job's fit is
# bit for bit the same whichever jobs share its batch; wider rows are summed in unrolled
# blocks where the zero padding moves the rounding (numpy 2.4; tests/test_perf_estimate.py
# checks it).  Within this width, fits are memoised per job's pooled observations.
EXACT_BATCH_WIDTH = 7
FITS_CACHED = 4096


@dataclass(frozen=True, slots=True)
class ScalingParams:
    """``T(n) = t0/n + t1 + t2*n + t3*[n > 1]`` seconds per step; all parameters >= 0."""

    t0: float
    t1: float
    t2: float
    t3: float = 0.0

    def step_time(self, n: float) -> float:
        n = max(float(n), 1e-9)
        jump = self.t3 if n > 1.0 else 0.0
        return max(self.t0 / n + self.t1 + self.t2 * n + jump, _MIN_T)

    def throughput(self, n: float) -> float:
        """Steps per second at ``n`` nodes (always finite and > 0)."""
        return 1.0 / self.step_time(n)

    def scaled(self, factor: float) -> ScalingParams:
        return ScalingParams(self.t0 * factor, self.t1 * factor, self.t2 * factor, self.t3 * factor)


def prior_params(
    ref_nodes: float,
    ref_step_time_s: float,
    shape: tuple[float, ...] = DEFAULT_SHAPE,
) -> ScalingParams:
    """Prior whose step time at ``ref_nodes`` is ``ref_step_time_s``, split as ``shape``.

    ``shape`` gives the shares (compute, fixed, per-node sync[, inter-node sync]).
    """
    n = max(float(ref_nodes), 1.0)
    t = ref_step_time_s if math.isfinite(ref_step_time_s) and ref_step_time_s > 0 else 1.0
    s0, s1, s2, s3 = ([max(float(x), 0.0) for x in shape] + [0.0, 0.0, 0.0, 0.0])[:4]
    total = s0 + s1 + s2 + s3 or 1.0
    unit = ScalingParams(n * s0 / total, s1 / total, s2 / total / n, s3 / total)
    return unit.scaled(t / unit.step_time(n))


@dataclass(frozen=True, slots=True)
class ThroughputFit:
    """The smooth model plus what it missed at the sizes actually observed.

    ``knots`` hold ``(log n, log(observed/model))`` per observed size.  Between observed
    sizes the correction is interpolated (in log-log), so the fit reproduces measured
    speeds and follows local structure the 4-parameter curve cannot (placement effects,
    noise-free plateaus).  Beyond them, local evidence is trusted near the edge and the
    physical model far away: in log space the prediction blends the line through the two
    outermost observed sizes (its slope clipped to [-1, 1]: speed-up can be neither
    super-linear nor fall faster than 1/n) with the smooth model plus a fading residual,
    the line's weight and the residual halving per doubling of the distance.  There is no
    jump at the edge and far extrapolation is the smooth model's (and its prior's) alone.
    """

    params: ScalingParams
    sizes: tuple[int, ...]  # distinct sizes observed
    n_obs: int
    rel_rmse: float  # relative step-time error of the smooth model at the observed sizes
    knots: tuple[tuple[float, float], ...] = ()
    # Beyond the largest observed size, never faster than the fastest observed size: set
    # for a job whose grow did not deliver what the fit promised (``outlook.GrowCheck``).
    flat_beyond: bool = False

    @property
    def confidence(self) -> float:
        """0 with nothing seen, ~0.5 with one size, -> 1 with three or more sizes."""
        return min(1.0, len(self.sizes) / 3.0) * (1.0 / (1.0 + 5.0 * self.rel_rmse))

    def correction(self, n: float) -> float:
        """Log-ratio observed/model at ``n`` (0 without knots)."""
        if not self.knots:
            return 0.0
        return self._correction_at(math.log(max(float(n), 1e-9)))

    def _correction_at(self, x: float) -> float:
        """``correction`` at ``x = log n`` (knots present)."""
        x0, c0 = self.knots[0]
        x1, c1 = self.knots[-1]
        if x <= x0:
            return c0 * 0.5 ** ((x0 - x) / _LN2)
        if x >= x1:
            return c1 * 0.5 ** ((x - x1) / _LN2)
        i = bisect.bisect_right(self.knots, (x, math.inf))
        (xa, ca), (xb, cb) = self.knots[i - 1], self.knots[i]
        return ca + (cb - ca) * (x - xa) / (xb - xa)

    def throughput(self, n: float) -> float:
        """Steps per second at ``n`` nodes (finite, > 0)."""
        speed = self._throughput(n)
        if self.flat_beyond and self.knots and math.log(max(float(n), 1e-9)) > self.knots[-1][0]:
            best = max(self._throughput(math.exp(x)) for x, _ in self.knots)
            return min(speed, best)
        return speed

    def _throughput(self, n: float) -> float:
        kn = self.knots
        x = math.log(max(float(n), 1e-9))
        smooth = math.log(self.params.throughput(n)) + (self._correction_at(x) if kn else 0.0)
        if len(kn) < 2 or kn[0][0] <= x <= kn[-1][0]:
            return math.exp(smooth)
        (xa, ca), (xb, cb) = (kn[1], kn[0]) if x < kn[0][0] else (kn[-2], kn[-1])
        ya = math.log(self.params.throughput(math.exp(xa))) + ca  # observed log speeds
        yb = math.log(self.params.throughput(math.exp(xb))) + cb
        slope = min(1.0, max(-1.0, (yb - ya) / (xb - xa)))
        line = yb + slope * (x - xb)
        w = 0.5 ** (abs(x - xb) / _LN2)
        return math.exp(w * line + (1.0 - w) * smooth)


def fit_throughput(
    nodes: Sequence[float] | np.ndarray,
    steps_per_s: Sequence[float] | np.ndarray,
    *,
    prior: ScalingParams | None = None,
    weights: Sequence[float] | np.ndarray | None = None,
    prior_strength: float = PRIOR_STRENGTH,
) -> ThroughputFit | None:
    """Fit ``T(n)`` to observed ``(nodes, steps/s)``; ``None`` when no usable point exists.

    Points with non-finite or non-positive values, or rates outside ``RATE_RANGE``, are
    dropped; repeated sizes are pooled (weighted geometric mean of the step time).  Without
    a ``prior`` one is built from the median observed size with ``DEFAULT_SHAPE``.
    """
    return fit_throughput_many([(nodes, steps_per_s, weights, prior)], prior_strength)[0]


Observations = tuple[
    Sequence[float] | np.ndarray,  # nodes
    Sequence[float] | np.ndarray,  # steps/s
    Sequence[float] | np.ndarray | None,  # weights
    ScalingParams | None,  # prior
]


def _floats(values: Sequence[float] | np.ndarray) -> list[float]:
    """``values`` flattened, as Python floats.  A list or tuple of numbers (what the daemon
    passes, a few per job and cycle) is converted without a round trip through numpy: the
    same IEEE rounding, a tenth of the cost."""
    if isinstance(values, list | tuple) and all(type(v) is float or type(v) is int for v in values):
        return [float(v) for v in values]
    return np.asarray(values, dtype=np.float64).ravel().tolist()


def _pool(
    nodes: Sequence[float] | np.ndarray,
    rates: Sequence[float] | np.ndarray,
    weights: Sequence[float] | np.ndarray | None,
) -> tuple[list[float], list[float], list[float], int] | None:
    """Usable points pooled per size: sizes, log step times, weights, raw count."""
    ns, fs = _floats(nodes), _floats(rates)
    m = min(len(ns), len(fs))
    ws = [1.0] * m if weights is None else _floats(weights)
    acc: dict[float, list[float]] = {}
    count = 0
    for n, f, w in zip(ns[:m], fs[:m], ws[:m], strict=False):
        if not (0.0 < n <= 1e6 and RATE_RANGE[0] <= f <= RATE_RANGE[1] and 0.0 < w < math.inf):
            continue  # also drops NaN: every comparison with NaN is False
        slot = acc.setdefault(n, [0.0, 0.0])
        slot[0] += w
        slot[1] -= w * math.log(f)
        count += 1
    if not acc:
        return None
    sizes = sorted(acc)
    return sizes, [acc[n][1] / acc[n][0] for n in sizes], [acc[n][0] for n in sizes], count


# Every non-empty subset of the 4 parameters: the NNLS optimum is the best feasible
# unconstrained solution on one of them (its support), so 15 small solves find it exactly.
_SUBSETS = np.array([[(i >> b) & 1 for b in range(4)] for i in range(1, 16)], dtype=np.float64)
# Per subset: the mask of its (a, b) entries and the identity on the parameters it leaves
# out, (1, 15, 4, 4) each.  Constant, so made once, not in every cycle's (often 1-job) fit.
_SUBSET_PAIRS = _SUBSETS[None, :, :, None] * _SUBSETS[None, :, None, :]
_SUBSET_EYE = np.eye(4) * (1.0 - _SUBSETS[None, :, :])[..., None]


# Pooled sizes, log step times, weights, raw count, prior and prior strength: all that
# one job's row of the solve reads.
_FitKey = tuple[
    tuple[float, ...], tuple[float, ...], tuple[float, ...], int, ScalingParams | None, float
]
_FITS: dict[_FitKey, ThroughputFit] = {}  # see fit_throughput_many


def fit_throughput_many(
    items: Sequence[Observations], prior_strength: float = PRIOR_STRENGTH
) -> list[ThroughputFit | None]:
    """``fit_throughput`` for many jobs in one vectorised solve (the daemon's cycle).

    A job refits whenever it reports, and its pooled observations (per-size rates, weights,
    prior) are often ones already fitted: its own when its speed is steady and its rate
    window full, another job's when both run the same thing.  In a narrow batch (see
    EXACT_BATCH_WIDTH) such a job's fit is taken from ``_FITS`` (4 in 10 of a 1,000-job
    simulation's fits; each solve costs ~0.2 ms, mostly numpy's per-call overhead).
    """
    pooled = [_pool(n, f, w) for n, f, w, _ in items]
    live = [i for i, p in enumerate(pooled) if p is not None]
    out: list[ThroughputFit | None] = [None] * len(items)
    keys: dict[int, _FitKey] = {}
    if live and max(len(pooled[i][0]) for i in live) <= EXACT_BATCH_WIDTH:  # type: ignore[index]
        for i in live:
            sizes, logt, ws, raw = pooled[i]  # type: ignore[misc]
            key = (tuple(sizes), tuple(logt), tuple(ws), raw, items[i][3], prior_strength)
            known = _FITS.get(key)
            if known is not None:
                out[i] = known
            else:
                keys[i] = key
        live = list(keys)
    if not live:
        return out
    J = len(live)
    S = max(len(pooled[i][0]) for i in live)  # type: ignore[index]
    # Rows padded to S with n = 1, log t = 0 and weight 0: a padded entry adds exact zeros
    # to every sum below (log 1 = 0), so no mask is needed where it only zeroes padding.
    rows_n, rows_lt, rows_w, rows_p = [], [], [], []
    for i in live:
        sizes, logt, ws, _ = pooled[i]  # type: ignore[misc]
        k = len(sizes)
        pad = S - k
        rows_n.append(sizes + [1.0] * pad)
        rows_lt.append(logt + [0.0] * pad)
        rows_w.append(ws + [0.0] * pad)
        prior = items[i][3]
        if prior is None:
            prior = prior_params(sizes[k // 2], math.exp(logt[k // 2]))
        rows_p.append((prior.t0, prior.t1, prior.t2, prior.t3))
    N, LT, W, P = np.array(rows_n), np.array(rows_lt), np.array(rows_w), np.array(rows_p)
    mask = W > 0
    cnt = mask.sum(axis=1)
    T = np.exp(LT)
    logN = np.log(N)
    multi = (N > 1.0).astype(np.float64)
    # Relative residuals (row / T_obs); ridge toward the prior, each parameter measured by
    # its share of the typical step time so that the penalty is dimensionless.
    phi = np.ones((J, S, 4))
    phi[:, :, 0] = 1.0 / N
    phi[:, :, 2] = N
    phi[:, :, 3] = multi
    phi /= T[:, :, None]
    n_ref = np.exp(logN.sum(axis=1) / cnt)
    t_ref = np.exp(LT.sum(axis=1) / cnt)
    cs2 = np.ones((J, 4))
    cs2[:, 0] = 1.0 / n_ref
    cs2[:, 2] = n_ref
    cs2 = (cs2 / t_ref[:, None]) ** 2
    lam = max(prior_strength, 0.0)
    A = np.einsum("js,jsa,jsb->jab", W, phi, phi)
    diag = A.reshape(J, 16)[:, ::5]  # a view of each A's diagonal
    diag += lam * cs2 + 1e-12 * diag.sum(axis=1)[:, None]
    b = np.einsum("js,jsa->ja", W, phi) + lam * cs2 * P
    m = _SUBSETS[None, :, :]  # (1, 15, 4)
    A_s = A[:, None] * _SUBSET_PAIRS + _SUBSET_EYE
    b_s = b[:, None, :] * m
    x = np.linalg.solve(A_s, b_s[..., None])[..., 0]  # (J, 15, 4)
    value = np.where((x >= -1e-12).all(axis=2), -(b_s * x).sum(axis=2), np.inf)
    sol = np.maximum(x[np.arange(J), value.argmin(axis=1)], 0)
    bad = ~np.isfinite(sol).all(axis=1) | (sol.sum(axis=1) <= 0.0)
    if bad.any():
        sol[bad] = P[bad]  # a degenerate solve keeps the prior, which is never wrong-signed
    pred = sol[:, 0:1] / N + sol[:, 1:2] + sol[:, 2:3] * N + sol[:, 3:4] * multi
    pred = np.maximum(pred, _MIN_T)
    rel = np.sqrt(np.where(mask, ((pred - T) / T) ** 2, 0.0).sum(axis=1) / cnt)
    # log(observed/model) speed per size, clipped to a factor of 10 so that one absurd
    # report cannot dominate the interpolation.
    corr = np.minimum(np.maximum(np.log(pred / T), -_LN10), _LN10)
    logn = logN.tolist()
    # Python floats for the per-job objects, converted in one call per array.
    params, rels, corrs = sol.tolist(), rel.tolist(), corr.tolist()
    for j, i in enumerate(live):
        sizes, _, _, raw = pooled[i]  # type: ignore[misc]
        k = len(sizes)
        out[i] = ThroughputFit(
            params=ScalingParams(*params[j]),
            sizes=tuple(sorted({round(v) for v in sizes})),
            n_obs=raw,
            rel_rmse=rels[j],
            knots=tuple(zip(logn[j][:k], corrs[j][:k], strict=True)),
        )
        fit_key = keys.get(i)
        if fit_key is not None:
            if len(_FITS) >= FITS_CACHED:
                del _FITS[next(iter(_FITS))]  # the oldest
            _FITS[fit_key] = out[i]  # type: ignore[assignment]
    return out


def statistical_efficiency(grad_noise_scale: float, batch: float, base_batch: float) -> float:
    """Pollux's ``E(B) = (phi + B0)/(phi + B)``: progress per sample at batch ``B`` vs ``B0``.

    Returns 1.0 for unusable input (unknown noise scale means "assume no loss").
    """
    vals = (grad_noise_scale, batch, base_batch)
    if not all(math.isfinite(v) for v in vals) or grad_noise_scale < 0 or batch <= 0:
        return 1.0
    if base_batch <= 0:
        return 1.0
    return float(min(1.0, (grad_noise_scale + base_batch) / (grad_noise_scale + batch)))


def goodput(throughput_samples_per_s: float, efficiency: float) -> float:
    """Useful samples per second: throughput times statistical efficiency (Pollux)."""
    if not (math.isfinite(throughput_samples_per_s) and math.isfinite(efficiency)):
        return 0.0
    return max(throughput_samples_per_s, 0.0) * min(max(efficiency, 0.0), 1.0)
