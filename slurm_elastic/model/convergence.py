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


def _solve_grid(
    cs: Array, k: Array, y: Array, w: Array, nonneg_b2: bool
) -> tuple[Array, Array, Array]:
    """Best ``(a, b2)`` with ``a >= 0`` (and ``b2 >= 0``) for every ``c``; returns a, b2, sse."""
    x = 1.0 / (k[None, :] + cs[:, None])  # (G, n)
    wx = w * x
    sw = w.sum()
    sy = (w * y).sum()
    syy = (w * y * y).sum()
    sx = wx.sum(axis=1)
    sxx = (wx * x).sum(axis=1)
    sxy = (wx * y).sum(axis=1)

    def sse(a: Array, b: Array) -> Array:
        return syy - 2 * a * sxy - 2 * b * sy + a * a * sxx + 2 * a * b * sx + b * b * sw

    det = sw * sxx - sx * sx
    safe = np.where(np.abs(det) > 1e-300, det, 1.0)
    a1 = np.where(np.abs(det) > 1e-300, (sw * sxy - sx * sy) / safe, 0.0)
    b1 = (sy - a1 * sx) / sw
    cand_a = [a1, np.zeros_like(sx)]
    cand_b = [b1, np.full_like(sx, sy / sw)]
    if nonneg_b2:
        cand_a.append(np.where(sxx > 0, sxy / np.where(sxx > 0, sxx, 1.0), 0.0))
        cand_b.append(np.zeros_like(sx))
    A = np.stack(cand_a)
    B = np.stack(cand_b)
    S = sse(A, B)
    valid = A >= 0.0
    if nonneg_b2:
        valid &= B >= 0.0
    S = np.where(valid, S, np.inf)
    pick = np.argmin(S, axis=0)
    cols = np.arange(cs.size)
    return A[pick, cols], B[pick, cols], np.maximum(S[pick, cols], 0.0)


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
    kk, yy = _clean(k, y)
    tr = choose_transform(yy, higher_is_better)
    ll = tr.to_loss(yy)
    n = int(kk.size)
    if n < MIN_POINTS or float(kk[-1] - kk[0]) <= 0.0:
        last = float(ll[-1]) if n else 0.0
        first = float(ll[0]) if n else 0.0
        return ConvergenceFit(
            kind="insufficient",
            transform=tr,
            a=0.0,
            c=0.0,
            b2=max(last, 0.0),
            n_points=n,
            k_first=float(kk[0]) if n else 0.0,
            k_last=float(kk[-1]) if n else 0.0,
            l_first=first,
            l_last_fit=max(last, 0.0),
            scale=0.0,
        )
    k_max = max(float(kk[-1]), 1e-12)
    span = float(kk[-1] - kk[0])
    w = np.exp(recency * ((kk - kk[-1]) / span))
    # Scale to O(1) so the normal-equation sums keep their precision.
    y_scale = max(float(np.abs(ll).max()), 1e-300)
    ly = ll / y_scale
    nonneg = True  # the transform makes l >= 0, so b2 >= 0 is always the right bound

    coarse = k_max * np.geomspace(_C_SPAN[0], _C_SPAN[1], _COARSE)
    a, b, s = _solve_grid(coarse, kk, ly, w, nonneg)
    best = int(np.argmin(s))

    # One Huber re-weighting pass: points far outside the robust scale count less.
    resid = ly - (b[best] + a[best] / (kk + coarse[best]))
    mad = float(np.median(np.abs(resid - np.median(resid))))
    scale = 1.4826 * mad
    if scale > 1e-12:
        h = np.minimum(1.0, HUBER_K * scale / np.maximum(np.abs(resid), 1e-300))
        w = w * h
        a, b, s = _solve_grid(coarse, kk, ly, w, nonneg)
        best = int(np.argmin(s))

    lo_i, hi_i = max(best - 1, 0), min(best + 1, _COARSE - 1)
    fine = np.geomspace(coarse[lo_i], coarse[hi_i], _FINE)
    fa, fb, fs = _solve_grid(fine, kk, ly, w, nonneg)
    cs = np.concatenate([coarse, fine])
    a = np.concatenate([a, fa])
    b = np.concatenate([b, fb])
    s = np.concatenate([s, fs])
    best = int(np.argmin(s))

    dof = max(n - 3, 1)
    limit = s[best] * (1.0 + _BAND_CHI2 / dof) + 1e-15
    members = np.nonzero(s <= limit)[0]
    band = tuple((float(a[i] * y_scale), float(cs[i]), float(b[i] * y_scale)) for i in members)
    a_best = float(a[best] * y_scale)
    c_best = float(cs[best])
    b2 = float(b[best] * y_scale)
    kind = "curve" if a_best > 0.0 else "flat"
    fitted_last = b2 + (a_best / (kk[-1] + c_best) if a_best > 0 else 0.0)
    resid_final = ll - (b2 + (a_best / (kk + c_best) if a_best > 0 else 0.0))
    mad_final = float(np.median(np.abs(resid_final - np.median(resid_final))))
    return ConvergenceFit(
        kind=kind,
        transform=tr,
        a=a_best,
        c=c_best,
        b2=b2,
        n_points=n,
        k_first=float(kk[0]),
        k_last=float(kk[-1]),
        l_first=float(ll[0]),
        l_last_fit=float(fitted_last),
        scale=1.4826 * mad_final,
        band=band,
    )


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
