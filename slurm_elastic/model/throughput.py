"""Training speed versus node count for data-parallel all-reduce jobs.

Step time model (Optimus' speed function reduced to all-reduce data parallelism, global
batch fixed per job):

    T(n) = t0/n + t1 + t2*n,    t0, t1, t2 >= 0,    throughput f(n) = 1/T(n) steps/s

``t0/n`` is the compute of one global batch split over ``n`` nodes, ``t1`` a fixed
per-step cost (optimizer, data loading, the size-independent part of all-reduce) and
``t2*n`` the part of synchronisation that grows with the number of peers.  ``t2 > 0`` lets
throughput *fall* beyond some size, which real tables show.

The fit is a non-negative least squares on *relative* residuals ``(T_obs - T)/T_obs`` with a
ridge toward prior parameters (a MAP estimate under a Gaussian prior): with one observed
size the prior decides the shape, and as more sizes are seen the data outweighs it.  That
is what keeps extrapolation to never-seen sizes safe.

Goodput (Pollux, OSDI'21) is optional: ``statistical_efficiency`` turns a reported gradient
noise scale into the fraction of a large batch's samples that still count as progress.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

# Site default shape of T(n) at the reference size: 85% compute that parallelises,
# 12% fixed overhead, 3% synchronisation that grows with n; throughput then peaks at about
# 5x the reference size.  Documented in the README; configurable through SiteDefaults.
DEFAULT_SHAPE = (0.85, 0.12, 0.03)
PRIOR_STRENGTH = 0.3  # weight of the prior, in units of one observed size
_MIN_T = 1e-9


@dataclass(frozen=True, slots=True)
class ScalingParams:
    """``T(n) = t0/n + t1 + t2*n`` seconds per step; all parameters >= 0."""

    t0: float
    t1: float
    t2: float

    def step_time(self, n: float) -> float:
        n = max(float(n), 1e-9)
        return max(self.t0 / n + self.t1 + self.t2 * n, _MIN_T)

    def throughput(self, n: float) -> float:
        """Steps per second at ``n`` nodes (always finite and > 0)."""
        return 1.0 / self.step_time(n)

    def scaled(self, factor: float) -> ScalingParams:
        return ScalingParams(self.t0 * factor, self.t1 * factor, self.t2 * factor)


def prior_params(
    ref_nodes: float, ref_step_time_s: float, shape: tuple[float, float, float] = DEFAULT_SHAPE
) -> ScalingParams:
    """Prior whose step time at ``ref_nodes`` is ``ref_step_time_s``, split as ``shape``."""
    n = max(float(ref_nodes), 1.0)
    t = ref_step_time_s if math.isfinite(ref_step_time_s) and ref_step_time_s > 0 else 1.0
    s0, s1, s2 = (max(float(x), 0.0) for x in shape)
    total = s0 + s1 + s2 or 1.0
    return ScalingParams(t * n * s0 / total, t * s1 / total, t * s2 / total / n)


@dataclass(frozen=True, slots=True)
class ThroughputFit:
    params: ScalingParams
    sizes: tuple[int, ...]  # distinct sizes observed
    n_obs: int
    rel_rmse: float  # relative step-time error at the observed sizes

    @property
    def confidence(self) -> float:
        """0 with nothing seen, ~0.5 with one size, -> 1 with three or more sizes."""
        return min(1.0, len(self.sizes) / 3.0) * (1.0 / (1.0 + 5.0 * self.rel_rmse))

    def throughput(self, n: float) -> float:
        return self.params.throughput(n)


def fit_throughput(
    nodes: Sequence[float] | np.ndarray,
    steps_per_s: Sequence[float] | np.ndarray,
    *,
    prior: ScalingParams | None = None,
    weights: Sequence[float] | np.ndarray | None = None,
    prior_strength: float = PRIOR_STRENGTH,
) -> ThroughputFit | None:
    """Fit ``T(n)`` to observed ``(nodes, steps/s)``; ``None`` when no usable point exists.

    Points with non-finite or non-positive values are dropped.  Without a ``prior`` one is
    built from the median observation with ``DEFAULT_SHAPE``.
    """
    n = np.asarray(nodes, dtype=np.float64).ravel()
    f = np.asarray(steps_per_s, dtype=np.float64).ravel()
    m = min(n.size, f.size)
    n, f = n[:m], f[:m]
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64).ravel()[:m]
    ok = np.isfinite(n) & np.isfinite(f) & (n > 0) & (f > 0) & np.isfinite(w) & (w > 0)
    n, f, w = n[ok], f[ok], w[ok]
    if n.size == 0:
        return None
    t_obs = 1.0 / f
    if prior is None:
        mid = int(np.argsort(n)[n.size // 2])
        prior = prior_params(n[mid], t_obs[mid])
    sw = np.sqrt(w)
    # Relative residuals: row i divided by T_obs_i.
    design = np.stack([1.0 / n, np.ones_like(n), n], axis=1) / t_obs[:, None] * sw[:, None]
    rhs = np.ones_like(n) * sw
    # Ridge toward the prior, each parameter measured by its share of the typical step
    # time at the observed sizes so that the penalty is dimensionless.
    n_ref = float(np.exp(np.mean(np.log(n))))
    t_ref = float(np.exp(np.mean(np.log(t_obs))))
    col_scale = np.array([1.0 / n_ref, 1.0, n_ref]) / t_ref
    lam = math.sqrt(max(prior_strength, 0.0))
    p = np.array([prior.t0, prior.t1, prior.t2])
    design = np.vstack([design, np.diag(lam * col_scale)])
    rhs = np.concatenate([rhs, lam * col_scale * p])
    try:
        sol, _ = nnls(design, rhs, maxiter=50)
    except (RuntimeError, ValueError):  # nnls gave up: keep the prior, it is never wrong-signed
        sol = p
    params = ScalingParams(float(sol[0]), float(sol[1]), float(sol[2]))
    if params.t0 + params.t1 + params.t2 <= 0.0:
        params = prior
    pred = np.array([params.step_time(x) for x in n])
    rel = float(np.sqrt(np.mean(((pred - t_obs) / t_obs) ** 2)))
    sizes = tuple(sorted({int(v) for v in np.rint(n)}))
    return ThroughputFit(params=params, sizes=sizes, n_obs=int(n.size), rel_rmse=rel)


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
