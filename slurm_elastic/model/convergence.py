"""Online convergence model (Optimus, EuroSys'18): ``l(k) = 1/(b0*k + b1) + b2``, all b >= 0.

We fit the equivalent form ``l(k) = b2 + a/(k + c)`` with ``a = 1/b0`` and ``c = b1/b0``.
For a fixed ``c`` the model is *linear* in ``(a, b2)``, so each candidate ``c`` costs one
weighted 2x2 least-squares solve with the bounds ``a >= 0, b2 >= 0`` enforced exactly
(the optimum of a convex 2-variable problem lies among four closed-form candidates).
A log-spaced grid over ``c`` plus a finer grid around the best one replaces a nonlinear
optimiser: it is vectorised, never diverges, and costs well under a millisecond.
Residuals stay in metric space (unlike fitting ``1/(l - b2)``, which blows noise up near
the asymptote).

* Later points weigh more (``recency``): the tail of a curve says most about where it goes.
* Outliers are down-weighted by one Huber re-weighting pass (scale from the MAD).
* Rising metrics (accuracy, F1) are turned into falling ones, ``l = U - y``, where ``U`` is
  the metric's natural ceiling (1 for fractions, 100 for percentages).  The bound
  ``b2 >= 0`` then says "the asymptote does not pass the ceiling", as it says "loss does not
  go below zero" for losses.
* Fewer than 3 finite points: no curve is fitted (``kind="insufficient"``) and predictions
  return ``None``; callers fall back to the prior.

Convergence criterion (one definition, used by the daemon and the validation bench):

* with a user target: the first ``k`` where the metric reaches the target;
* otherwise: the first ``k`` where the remaining improvement is at most ``tol`` (default 5%)
  of the whole improvement from the first observed point to the asymptote,
  ``|l(k) - l_inf| <= tol * |l_first - l_inf|``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

MIN_POINTS = 3
DEFAULT_TOL = 0.05
RECENCY = 1.0  # oldest point weighs exp(-RECENCY) of the newest
HUBER_K = 1.345  # 95% efficiency under Gaussian noise
_COARSE = 32
_FINE = 16
_C_SPAN = (1e-4, 1e2)  # c relative to the largest k; large c means "still almost linear"
_BAND_CHI2 = 2.71  # 90% one-parameter profile interval
BAND_CAP = 100.0  # band upper ends are capped at BAND_CAP * k_last to stay finite

Array = NDArray[np.float64]

# Grids are built once: c = k_max * _UNIT_COARSE, and the fine grid between two coarse
# neighbours lo, hi is lo * (hi/lo) ** _FINE_FRAC (log-spaced, no np.geomspace per fit).
_UNIT_COARSE = np.geomspace(_C_SPAN[0], _C_SPAN[1], _COARSE)
_FINE_FRAC = np.linspace(0.0, 1.0, _FINE)


@dataclass(frozen=True, slots=True)
class MetricTransform:
    """Maps a metric to a non-negative falling "loss" ``l`` and back."""

    higher_is_better: bool
    offset: float  # l = offset - y (rising) or l = y - offset (falling)

    def to_loss(self, y: ArrayLike) -> Array:
        v = np.asarray(y, dtype=np.float64)
        return self.offset - v if self.higher_is_better else v - self.offset

    def to_metric(self, loss: float) -> float:
        return self.offset - loss if self.higher_is_better else loss + self.offset


def choose_transform(y: ArrayLike, higher_is_better: bool) -> MetricTransform:
    """Pick the ceiling (rising metrics) or floor (falling ones) that makes ``l >= 0``."""
    v = np.asarray(y, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return MetricTransform(higher_is_better, 1.0 if higher_is_better else 0.0)
    lo, hi = float(v.min()), float(v.max())
    spread = max(hi - lo, abs(hi), 1e-12)
    if higher_is_better:
        if lo >= 0.0 and hi <= 1.0:
            ceiling = 1.0  # fraction (accuracy, hit rate)
        elif lo >= 0.0 and hi <= 100.0:
            ceiling = 100.0  # percentage
        else:
            ceiling = hi + 10.0 * spread  # unbounded metric: a loose ceiling
        return MetricTransform(True, ceiling)
    floor = 0.0 if lo >= 0.0 else lo - 10.0 * spread  # losses are >= 0; else a loose floor
    return MetricTransform(False, floor)


@dataclass(frozen=True, slots=True)
class ConvergenceFit:
    """A fitted curve ``l(k) = b2 + a/(k + c)`` in transformed (falling, >= 0) space."""

    kind: str  # "curve" | "flat" | "insufficient"
    transform: MetricTransform
    a: float
    c: float
    b2: float
    n_points: int
    k_first: float
    k_last: float
    l_first: float  # observed loss-space value at the first point
    l_last_fit: float  # fitted loss-space value at the last point
    scale: float  # robust residual scale (loss space)
    band: tuple[tuple[float, float, float], ...] = ()  # plausible (a, c, b2) triples

    @property
    def b0(self) -> float:
        return 1.0 / self.a if self.a > 0.0 else 0.0

    @property
    def b1(self) -> float:
        """``c/a``; a flat curve (``a == 0``) has no finite b1 and reports ``inf``."""
        return self.c / self.a if self.a > 0.0 else math.inf

    @property
    def asymptote(self) -> float:
        """The metric's predicted limit, in metric units."""
        return self.transform.to_metric(self.b2)

    def loss_at(self, k: float) -> float:
        return self.b2 + (self.a / (k + self.c) if self.a > 0.0 else 0.0)

    def metric_at(self, k: float) -> float:
        return self.transform.to_metric(self.loss_at(k))


@dataclass(frozen=True, slots=True)
class ConvergencePrediction:
    """Progress (same unit as the fitted ``k``) at which the criterion is met."""

    k: float  # point estimate, finite, >= k_first
    lo: float
    hi: float
    mode: str  # "target" | "asymptote"
    reachable: bool  # False: the user target lies beyond the fitted asymptote


def _clean(k: ArrayLike, y: ArrayLike) -> tuple[Array, Array]:
    kk = np.asarray(k, dtype=np.float64).ravel()
    yy = np.asarray(y, dtype=np.float64).ravel()
    n = min(kk.size, yy.size)
    kk, yy = kk[:n], yy[:n]
    ok = np.isfinite(kk) & np.isfinite(yy) & (kk >= 0.0)
    kk, yy = kk[ok], yy[ok]
    order = np.argsort(kk, kind="stable")
    return kk[order], yy[order]


def _solve_grid(cs: Array, k: Array, y: Array, w: Array) -> tuple[Array, Array, Array]:
    """Best ``(a, b2)`` with ``a >= 0, b2 >= 0`` for every job and every ``c``.

    Shapes: ``cs`` (J, G); ``k``, ``y``, ``w`` (J, N) with ``w == 0`` on padding.
    Returns ``a``, ``b2``, weighted SSE, each (J, G).  The optimum of this convex
    2-variable problem is one of four closed-form candidates: unconstrained, ``a = 0``,
    ``b2 = 0``, or both zero (never better than ``a = 0`` since ``y >= 0``).
    """
    x = 1.0 / (k[:, None, :] + cs[:, :, None])  # (J, G, N)
    wy = w * y
    sw = w.sum(axis=1)[:, None]
    sy = wy.sum(axis=1)[:, None]
    syy = (wy * y).sum(axis=1)[:, None]
    # Batched matrix-vector products: no (J, G, N) temporaries beyond x and x*x.
    sx = (x @ w[:, :, None])[..., 0]
    sxy = (x @ wy[:, :, None])[..., 0]
    sxx = ((x * x) @ w[:, :, None])[..., 0]
    det = sw * sxx - sx * sx
    ok = np.abs(det) > 1e-300
    a1 = np.where(ok, (sw * sxy - sx * sy) / np.where(ok, det, 1.0), 0.0)
    b1 = (sy - a1 * sx) / sw
    a3 = np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0)
    A = np.stack([a1, np.zeros_like(sx), a3])
    B = np.stack([b1, np.broadcast_to(sy / sw, sx.shape), np.zeros_like(sx)])
    S = syy - 2 * A * sxy - 2 * B * sy + A * A * sxx + 2 * A * B * sx + B * B * sw
    S = np.where((A >= 0.0) & (B >= 0.0), S, np.inf)
    pick = np.argmin(S, axis=0)[None]
    a = np.take_along_axis(A, pick, 0)[0]
    b = np.take_along_axis(B, pick, 0)[0]
    return a, b, np.maximum(np.take_along_axis(S, pick, 0)[0], 0.0)


def _masked_median(x: Array, mask: Array) -> Array:
    """Row medians of ``x`` over ``mask`` (J, N) -> (J,)."""
    return np.nanmedian(np.where(mask, x, np.nan), axis=1)


def _insufficient(kk: Array, ll: Array, tr: MetricTransform) -> ConvergenceFit:
    n = int(kk.size)
    last = max(float(ll[-1]), 0.0) if n else 0.0
    return ConvergenceFit(
        kind="insufficient",
        transform=tr,
        a=0.0,
        c=0.0,
        b2=last,
        n_points=n,
        k_first=float(kk[0]) if n else 0.0,
        k_last=float(kk[-1]) if n else 0.0,
        l_first=float(ll[0]) if n else 0.0,
        l_last_fit=last,
        scale=0.0,
    )


def fit_convergence(
    k: ArrayLike,
    y: ArrayLike,
    *,
    higher_is_better: bool = False,
    recency: float = RECENCY,
) -> ConvergenceFit:
    """Fit the Optimus curve to ``(k, y)``; never raises on degenerate data.

    NaN/inf points and negative ``k`` are dropped.  With fewer than ``MIN_POINTS`` left the
    result has ``kind="insufficient"`` (a flat line at the last value).
    """
    return fit_convergence_many([(k, y, higher_is_better)], recency=recency)[0]


def fit_convergence_many(
    series: Sequence[tuple[ArrayLike, ArrayLike, bool]],
    *,
    recency: float = RECENCY,
    chunk: int = 256,
) -> list[ConvergenceFit]:
    """``fit_convergence`` for many jobs at once: one vectorised solve per chunk of jobs.

    This is what keeps a daemon cycle over thousands of jobs cheap: the per-call overhead
    of numpy is paid per chunk, not per job.
    """
    out: list[ConvergenceFit | None] = [None] * len(series)
    todo: list[tuple[int, Array, Array, MetricTransform]] = []
    for i, (k, y, rising) in enumerate(series):
        kk, yy = _clean(k, y)
        tr = choose_transform(yy, rising)
        ll = tr.to_loss(yy)
        if kk.size < MIN_POINTS or float(kk[-1] - kk[0]) <= 0.0:
            out[i] = _insufficient(kk, ll, tr)
        else:
            todo.append((i, kk, ll, tr))
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        for (i, *_), fit in zip(part, _fit_chunk(part, recency), strict=True):
            out[i] = fit
    return [f for f in out if f is not None]


def _fit_chunk(
    part: Sequence[tuple[int, Array, Array, MetricTransform]], recency: float
) -> list[ConvergenceFit]:
    J = len(part)
    N = max(kk.size for _, kk, _, _ in part)
    K = np.ones((J, N))
    L = np.zeros((J, N))
    W = np.zeros((J, N))
    mask = np.zeros((J, N), dtype=bool)
    y_scale = np.empty(J)
    for j, (_, kk, ll, _) in enumerate(part):
        n = kk.size
        scale = max(float(np.abs(ll).max()), 1e-300)  # O(1) values keep sums precise
        y_scale[j] = scale
        K[j, :n] = kk
        L[j, :n] = ll / scale
        W[j, :n] = np.exp(recency * (kk - kk[-1]) / (kk[-1] - kk[0]))
        mask[j, :n] = True
    k_max = np.maximum(K.max(axis=1, where=mask, initial=0.0), 1e-12)
    rows = np.arange(J)

    coarse = k_max[:, None] * _UNIT_COARSE[None, :]
    a, b, s = _solve_grid(coarse, K, L, W)
    best = np.argmin(s, axis=1)

    # One Huber re-weighting pass: points far outside the robust scale count less.
    pred = b[rows, best][:, None] + a[rows, best][:, None] / (K + coarse[rows, best][:, None])
    resid = L - pred
    med = _masked_median(resid, mask)
    scale = 1.4826 * _masked_median(np.abs(resid - med[:, None]), mask)
    huber = np.where(
        (scale[:, None] > 1e-12) & mask,
        np.minimum(1.0, HUBER_K * scale[:, None] / np.maximum(np.abs(resid), 1e-300)),
        1.0,
    )
    W = W * huber
    a, b, s = _solve_grid(coarse, K, L, W)
    best = np.argmin(s, axis=1)

    lo = coarse[rows, np.maximum(best - 1, 0)]
    hi = coarse[rows, np.minimum(best + 1, _COARSE - 1)]
    fine = lo[:, None] * (hi / lo)[:, None] ** _FINE_FRAC[None, :]
    fa, fb, fs = _solve_grid(fine, K, L, W)
    cs = np.concatenate([coarse, fine], axis=1)
    a = np.concatenate([a, fa], axis=1)
    b = np.concatenate([b, fb], axis=1)
    s = np.concatenate([s, fs], axis=1)
    best = np.argmin(s, axis=1)

    a_best = a[rows, best] * y_scale
    c_best = cs[rows, best]
    b2_best = b[rows, best] * y_scale
    n_pts = mask.sum(axis=1)
    dof = np.maximum(n_pts - 3, 1)
    limit = s[rows, best] * (1.0 + _BAND_CHI2 / dof) + 1e-15
    in_band = s <= limit[:, None]
    fitted = b2_best[:, None] + a_best[:, None] / (K + c_best[:, None])
    resid = L * y_scale[:, None] - fitted
    med = _masked_median(resid, mask)
    final_scale = 1.4826 * _masked_median(np.abs(resid - med[:, None]), mask)

    fits = []
    for j, (_, kk, ll, tr) in enumerate(part):
        members = np.nonzero(in_band[j])[0]
        band = tuple(
            zip(
                (a[j, members] * y_scale[j]).tolist(),
                cs[j, members].tolist(),
                (b[j, members] * y_scale[j]).tolist(),
                strict=True,
            )
        )
        aj = float(a_best[j])
        fits.append(
            ConvergenceFit(
                kind="curve" if aj > 0.0 else "flat",
                transform=tr,
                a=aj,
                c=float(c_best[j]),
                b2=float(b2_best[j]),
                n_points=int(kk.size),
                k_first=float(kk[0]),
                k_last=float(kk[-1]),
                l_first=float(ll[0]),
                l_last_fit=float(fitted[j, kk.size - 1]),
                scale=float(final_scale[j]),
                band=band,
            )
        )
    return fits


def _k_for(
    a: float, c: float, b2: float, fit: ConvergenceFit, target_l: float | None, tol: float
) -> float:
    """Smallest ``k >= k_first`` meeting the criterion for one parameter triple (may be inf)."""
    if a <= 0.0:
        # Flat: nothing more to gain (asymptote mode) / never improves (target mode).
        if target_l is None or b2 <= target_l:
            return fit.k_first
        return math.inf
    if target_l is None:
        gap = tol * (fit.l_first - b2)
        if gap <= 0.0:
            return fit.k_first
        return max(fit.k_first, a / gap - c)
    if target_l <= b2:
        return math.inf
    return max(fit.k_first, a / (target_l - b2) - c)


def predict_convergence(
    fit: ConvergenceFit, *, target: float | None = None, tol: float = DEFAULT_TOL
) -> ConvergencePrediction | None:
    """Progress at which the criterion is met, with a band; ``None`` without a curve.

    A target beyond the fitted asymptote is *unreachable*: the prediction then falls back
    to the asymptote criterion and says ``reachable=False`` (callers should trust it less).
    Every returned value is finite: band ends are capped at ``BAND_CAP * k_last``.
    """
    if fit.kind == "insufficient":
        return None
    tol = tol if math.isfinite(tol) and 0.0 < tol < 1.0 else DEFAULT_TOL
    target_l: float | None = None
    if target is not None and math.isfinite(target):
        target_l = float(fit.transform.to_loss(target))
    k = _k_for(fit.a, fit.c, fit.b2, fit, target_l, tol)
    reachable = math.isfinite(k)
    if not reachable:
        target_l = None
        k = _k_for(fit.a, fit.c, fit.b2, fit, None, tol)
    cap = BAND_CAP * max(fit.k_last, 1.0)
    k = min(k, cap)
    ks = [min(_k_for(a, c, b2, fit, target_l, tol), cap) for a, c, b2 in fit.band] or [k]
    return ConvergencePrediction(
        k=k,
        lo=min(min(ks), k),
        hi=max(max(ks), k),
        mode="target" if target_l is not None else "asymptote",
        reachable=reachable,
    )
