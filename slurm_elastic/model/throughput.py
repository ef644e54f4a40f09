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
from scipy.optimize import nnls

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
    noise-free plateaus); beyond them it fades by half per doubling of the distance, so far
    extrapolation is the smooth model's (and its prior's) alone, without a jump at the edge.
    """

    params: ScalingParams
    sizes: tuple[int, ...]  # distinct sizes observed
    n_obs: int
    rel_rmse: float  # relative step-time error of the smooth model at the observed sizes
    knots: tuple[tuple[float, float], ...] = ()

    @property
    def confidence(self) -> float:
        """0 with nothing seen, ~0.5 with one size, -> 1 with three or more sizes."""
        return min(1.0, len(self.sizes) / 3.0) * (1.0 / (1.0 + 5.0 * self.rel_rmse))

    def correction(self, n: float) -> float:
        """Log-ratio observed/model at ``n`` (0 without knots)."""
        if not self.knots:
            return 0.0
        x = math.log(max(float(n), 1e-9))
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
        return self.params.throughput(n) * math.exp(self.correction(n))


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
    dropped.  Without a ``prior`` one is
    built from the median observation with ``DEFAULT_SHAPE``.
    """
    n = np.asarray(nodes, dtype=np.float64).ravel()
    f = np.asarray(steps_per_s, dtype=np.float64).ravel()
    m = min(n.size, f.size)
    n, f = n[:m], f[:m]
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64).ravel()[:m]
    ok = np.isfinite(n) & np.isfinite(f) & (n > 0) & (n <= 1e6) & np.isfinite(w) & (w > 0)
    ok &= (f >= RATE_RANGE[0]) & (f <= RATE_RANGE[1])
    n, f, w = n[ok], f[ok], w[ok]
    if n.size == 0:
        return None
    t_obs = 1.0 / f
    if prior is None:
        mid = int(np.argsort(n)[n.size // 2])
        prior = prior_params(n[mid], t_obs[mid])
    sw = np.sqrt(w)
    # Relative residuals: row i divided by T_obs_i.
    multi = (n > 1.0).astype(np.float64)
    design = np.stack([1.0 / n, np.ones_like(n), n, multi], axis=1) / t_obs[:, None] * sw[:, None]
    rhs = np.ones_like(n) * sw
    # Ridge toward the prior, each parameter measured by its share of the typical step
    # time at the observed sizes so that the penalty is dimensionless.
    n_ref = float(np.exp(np.mean(np.log(n))))
    t_ref = float(np.exp(np.mean(np.log(t_obs))))
    col_scale = np.array([1.0 / n_ref, 1.0, n_ref, 1.0]) / t_ref
    lam = math.sqrt(max(prior_strength, 0.0))
    p = np.array([prior.t0, prior.t1, prior.t2, prior.t3])
    design = np.vstack([design, np.diag(lam * col_scale)])
    rhs = np.concatenate([rhs, lam * col_scale * p])
    try:
        sol, _ = nnls(design, rhs, maxiter=50)
    except (RuntimeError, ValueError):  # nnls gave up: keep the prior, it is never wrong-signed
        sol = p
    params = ScalingParams(float(sol[0]), float(sol[1]), float(sol[2]), float(sol[3]))
    if params.t0 + params.t1 + params.t2 + params.t3 <= 0.0:
        params = prior
    pred = np.array([params.step_time(x) for x in n])
    rel = float(np.sqrt(np.mean(((pred - t_obs) / t_obs) ** 2)))
    # Per distinct size: weighted mean of log(observed/model) speed, clipped to a factor
    # of 10 so one absurd report cannot dominate the interpolation.
    uniq, inv = np.unique(n, return_inverse=True)
    ratio = np.clip(np.log(pred / t_obs), -_LN10, _LN10)
    corr = np.bincount(inv, weights=w * ratio) / np.bincount(inv, weights=w)
    knots = tuple(zip(np.log(uniq).tolist(), corr.tolist(), strict=True))
    sizes = tuple(sorted({int(v) for v in np.rint(n)}))
    return ThroughputFit(params=params, sizes=sizes, n_obs=int(n.size), rel_rmse=rel, knots=knots)


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
