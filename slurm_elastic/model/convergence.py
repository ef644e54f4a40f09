"""Online convergence model: Optimus (EuroSys'18) curves, chosen among families on the prefix.

**Families.**  Every family is ``l(k) = b2 + a * x_s(k)`` with ``a, b2 >= 0`` and one shape
parameter ``s > 0`` (stored in ``ConvergenceFit.c``):

* ``optimus``: ``x = 1/(k + c)``, i.e. Optimus' ``l(k) = 1/(b0*k + b1) + b2`` with
  ``a = 1/b0``, ``c = b1/b0``;
* ``power``: ``x = (k/k_last + 0.01)^-p`` (a power law in progress; the 1% offset of the
  observed span only keeps a report at ``k = 0`` finite);
* ``exp`` (the default): ``x = exp(-(k - k_first)/tau)`` (exponential saturation).

For a fixed ``s`` each family is *linear* in ``(a, b2)``, so each candidate ``s`` costs one
weighted 2x2 least-squares solve with the bounds enforced exactly (the optimum of a convex
2-variable problem lies among four closed-form candidates).  A 32-point log grid over ``s``
plus a 16-point refinement replaces a nonlinear optimiser: vectorised over jobs, never
diverges.  Residuals stay in metric space.  Later points weigh more (``recency``), one Huber
pass (MAD scale) down-weights outliers.  Rising metrics (accuracy, F1) become falling ones,
``l = U - y`` with ``U`` the metric's natural ceiling (1 for fractions, 100 for percentages).
Fewer than 3 finite points: no curve (``kind="insufficient"``), predictions return ``None``.

**Which family.**  The three agree on the data seen but differ in how fast they flatten
beyond it (exponential < Optimus < small-``p`` power law), which is exactly what the
plateau prediction depends on.  ``DEFAULT_FAMILY = "exp"`` was chosen on public training
curves (Pollux's validation curves of five models, ``scripts/bench_models.py``) and
checked leave-one-model-out: choosing among ``exp``, ``optimus``, ``power`` and ``auto`` on
four models picks ``exp`` for the fifth every time, and on curves whose plateau still lay
ahead it predicts the plateau epoch with a median error of 0.13 (after 25% of the curve)
and 0.20 (50%) against 0.65 / 1.95 for Optimus and 0.83 / 1.35 for ``auto``.  Why it fits:
these runs use learning-rate schedules (steps, decays) under which the metric saturates
within a few epochs of its last gain instead of creeping on as ``1/k`` or ``k^-p`` tails do.
The other families stay available (``model.curve_family`` in the daemon's configuration);
Optimus is kept exact, so a site whose jobs follow it can choose it.

``auto`` selects per job by rolling-origin holdout on the observed prefix only: each family
is fitted on the first 50% and on the first 75% of the observed points (at least 3) and
scored by the mean Huber loss (the fit's own robust loss, scaled by the median of the
families' robust residual scales) of its predictions of the remaining observed points,
summed over the two origins; the lowest score wins, ties go to the default.  With fewer
than 4 points nothing can be held out and the default is used.  It extrapolates a few
points well but the plateau, tens of points ahead, badly (figures above), which is why it
is not the default.  Selection costs about six fits, so the daemon (``outlook.ModelBank``)
re-selects only when a job's observed progress has grown by 25% since the last selection.

**Convergence criterion** (one definition: the daemon, the truth of the validation bench
and its prediction all use it).  Either a user target (the first ``k`` where the curve
reaches it) or *the relative change over a window falls below a threshold*:

    converged at the first k >= k_first + w with
        l(k - w) - l(k) <= THRESHOLD * (l_first - l(k))

i.e. over the last ``w`` units of progress the metric improved by at most ``THRESHOLD`` of
the improvement achieved since the first observation.  ``l`` is the fitted curve (for the
prediction) or the observed metric smoothed by a centred 3-point mean (for the bench's
truth); ``l_first`` is the mean of the first two observed points in both cases (the
smoothed first value).  "Relative to the improvement so far" rather than to the metric's
value because the criterion then does not depend on the metric's offset or direction
(loss with an unknown floor, accuracy vs error rate give the same answer).  A curve that
does not improve at all is converged once a window has passed.

Constants, fixed before any measurement on the validation curves and taken from common
practice, not from data:

* ``PATIENCE_EPOCHS = 5``: the window, in epochs.  Early-stopping patience in practice runs
  from 3 to 10 epochs (Keras examples 3-5, PyTorch ``ReduceLROnPlateau`` default 10); 5 is
  the middle.  The daemon converts it with the job's reported epochs (progress per epoch);
  for a job that reports no epochs, the window is 5 metric reports (Keras counts patience
  in evaluations).
* ``THRESHOLD = 0.01``: over those 5 epochs, less than 1% of the gain made so far (0.2% per
  epoch): a gain nobody keeps a job running for.  A first version measured convergence
  differently (remaining improvement <= 5% of the improvement to the fitted asymptote);
  docs/benchmarks.md "Progress models" keeps its figures.

The uncertainty band is the profile of the chosen family's fit over its shape parameter
(90% one-parameter interval), its ends capped at ``BAND_CAP * k_last`` to stay finite.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

MIN_POINTS = 3
PATIENCE_EPOCHS = 5.0  # the criterion's window (see the module docstring)
THRESHOLD = 0.01  # the criterion's relative change
RECENCY = 1.0  # oldest point weighs exp(-RECENCY) of the newest
HUBER_K = 1.345  # 95% efficiency under Gaussian noise
_COARSE = 32
_FINE = 16
_BAND_CHI2 = 2.71  # 90% one-parameter profile interval
BAND_CAP = 100.0  # band upper ends are capped at BAND_CAP * k_last to stay finite
DEFAULT_FAMILY = "exp"  # see "Which family" in the module docstring
AUTO = "auto"  # per-job selection by rolling-origin holdout
HOLDOUT_ORIGINS = (0.5, 0.75)  # fractions of the observed points fitted before scoring
_POWER_OFFSET = 0.01  # power law: x = (k/k_last + 0.01)^-p
# Solving the criterion: a log grid brackets it (steps of 2^(1/3)), then _REFINE levels of
# a _SUB-point grid inside the bracket (relative precision about 0.26 / 32^3 = 1e-5).
_REFINE = 3
_SUB_FRAC = np.linspace(0.0, 1.0, 33)
_SEARCH = np.geomspace(1.0, 2.0**40, 121)  # where the criterion is searched, x (k_first + w)

Array = NDArray[np.float64]
Bools = NDArray[np.bool_]
# A family's basis also takes the fit's own k_first/k_last as scalars (they broadcast).
Bound = Array | np.float64


def _x_optimus(k: Array, s: Array, k_first: Bound, k_last: Bound) -> Array:
    return 1.0 / (k + s)


def _x_power(k: Array, s: Array, k_first: Bound, k_last: Bound) -> Array:
    return (k / k_last + _POWER_OFFSET) ** (-s)


def _x_exp(k: Array, s: Array, k_first: Bound, k_last: Bound) -> Array:
    return np.exp(-(k - k_first) / s)


@dataclass(frozen=True, slots=True)
class Family:
    """One curve family ``l = b2 + a*x_s(k)``; the shape grid is ``unit`` (times ``k_last``
    when ``relative``).  ``x`` broadcasts over any shapes of ``k``, ``s``, ``k_first``,
    ``k_last``."""

    name: str
    x: Callable[[Array, Array, Bound, Bound], Array]
    unit: Array
    relative: bool


FAMILIES: dict[str, Family] = {
    # The default first: selection's argmin keeps it on ties.
    # time constants from 1% of the observed span to 10x it (then it is almost linear).
    "exp": Family("exp", _x_exp, np.geomspace(1e-2, 1e1, _COARSE), True),
    # c relative to the largest k; large c means "still almost linear".
    "optimus": Family("optimus", _x_optimus, np.geomspace(1e-4, 1e2, _COARSE), True),
    # exponents from a barely-falling tail (0.05) to a steep one (4).
    "power": Family("power", _x_power, np.geomspace(0.05, 4.0, _COARSE), False),
}
FAMILY_CHOICES = (*FAMILIES, AUTO)
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
    """A fitted curve ``l(k) = b2 + a*x_c(k)`` in transformed (falling, >= 0) space."""

    kind: str  # "curve" | "flat" | "insufficient"
    transform: MetricTransform
    a: float
    c: float  # the family's shape parameter (Optimus c, power exponent p, exp tau)
    b2: float
    n_points: int
    k_first: float
    k_last: float
    l_first: float  # smoothed first value: mean of the first two observed points (loss space)
    l_last_fit: float  # fitted loss-space value at the last point
    scale: float  # robust residual scale (loss space)
    band: tuple[tuple[float, float, float], ...] = ()  # plausible (a, c, b2) triples
    family: str = DEFAULT_FAMILY
    spacing: float = 1.0  # median distance between observed points (the default window unit)

    @property
    def b0(self) -> float:
        """Optimus' ``b0``; 0.0 for a flat curve or another family."""
        return 1.0 / self.a if self.a > 0.0 and self.family == "optimus" else 0.0

    @property
    def b1(self) -> float:
        """Optimus' ``b1 = c/a``; ``inf`` for a flat curve or another family."""
        return self.c / self.a if self.a > 0.0 and self.family == "optimus" else math.inf

    @property
    def asymptote(self) -> float:
        """The metric's predicted limit, in metric units."""
        return self.transform.to_metric(self.b2)

    def losses(
        self,
        k: ArrayLike,
        a: ArrayLike | None = None,
        c: ArrayLike | None = None,
        b2: ArrayLike | None = None,
    ) -> Array:
        """Loss-space curve at ``k`` (broadcasting), for this fit or other (a, c, b2)."""
        a_ = np.asarray(self.a if a is None else a, dtype=np.float64)
        c_ = np.asarray(self.c if c is None else c, dtype=np.float64)
        b_ = np.asarray(self.b2 if b2 is None else b2, dtype=np.float64)
        kk = np.asarray(k, dtype=np.float64)
        if self.kind == "insufficient":
            return np.broadcast_to(b_, np.broadcast_shapes(kk.shape, b_.shape)).astype(float)
        fam = FAMILIES[self.family]
        safe_c = np.where(c_ > 0.0, c_, 1.0)
        x = fam.x(kk, safe_c, np.float64(self.k_first), np.float64(max(self.k_last, 1e-300)))
        return b_ + np.where(a_ > 0.0, a_ * x, 0.0)

    def loss_at(self, k: float) -> float:
        return float(self.losses(k))

    def metric_at(self, k: float) -> float:
        return self.transform.to_metric(self.loss_at(k))


@dataclass(frozen=True, slots=True)
class ConvergencePrediction:
    """Progress (same unit as the fitted ``k``) at which the criterion is met."""

    k: float  # point estimate, finite, >= k_first
    lo: float
    hi: float
    mode: str  # "target" | "plateau"
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


def _solve_grid(x: Array, y: Array, w: Array) -> tuple[Array, Array, Array]:
    """Best ``(a, b2)`` with ``a >= 0, b2 >= 0`` for every job and every grid shape.

    Shapes: ``x`` (J, G, N) the family's basis; ``y``, ``w`` (J, N) with ``w == 0`` on
    padding.  Returns ``a``, ``b2``, weighted SSE, each (J, G).  The optimum of this convex
    2-variable problem is one of four closed-form candidates: unconstrained, ``a = 0``,
    ``b2 = 0``, or both zero (never better than ``a = 0`` since ``y >= 0``).
    """
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
    S = np.where((A >= 0.0) & (B >= 0.0) & np.isfinite(S), S, np.inf)
    pick = np.argmin(S, axis=0)[None]
    a = np.take_along_axis(A, pick, 0)[0]
    b = np.take_along_axis(B, pick, 0)[0]
    return a, b, np.maximum(np.take_along_axis(S, pick, 0)[0], 0.0)


def _masked_median(x: Array, mask: Bools) -> Array:
    """Row medians of ``x`` over ``mask`` (J, N) -> (J,); NaN for a row with nothing in it.

    Equal to ``np.nanmedian(np.where(mask, x, nan), axis=1)`` (NaN entries are ignored) at
    a fraction of its cost: ``nanmedian`` goes through masked arrays, which made it half of
    the daemon's refit time.  Masked entries sort last as ``+inf``; the median is read off
    at each row's own count.
    """
    keep = mask & ~np.isnan(x)
    s = np.sort(np.where(keep, x, np.inf), axis=1)
    n = keep.sum(axis=1)
    rows = np.arange(x.shape[0])
    lo = s[rows, np.maximum(n - 1, 0) // 2]
    hi = s[rows, np.minimum(n // 2, max(x.shape[1] - 1, 0))]
    with np.errstate(invalid="ignore"):
        mid = np.where(lo == hi, lo, 0.5 * (lo + hi))  # keeps +-inf medians exact
    return np.where(n > 0, mid, np.nan)


def _first_two_mean(ll: Array) -> float:
    return float(ll[:2].mean()) if ll.size else 0.0


def _spacing(kk: Array) -> float:
    d = np.diff(kk)
    d = d[d > 0.0]
    return float(np.median(d)) if d.size else 1.0


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
        l_first=_first_two_mean(ll),
        l_last_fit=last,
        scale=0.0,
        spacing=_spacing(kk),
    )


Prepared = tuple[int, Array, Array, MetricTransform]


def _prepare(
    series: Sequence[tuple[ArrayLike, ArrayLike, bool]],
) -> tuple[list[ConvergenceFit | None], list[Prepared]]:
    out: list[ConvergenceFit | None] = [None] * len(series)
    todo: list[Prepared] = []
    for i, (k, y, rising) in enumerate(series):
        kk, yy = _clean(k, y)
        tr = choose_transform(yy, rising)
        ll = tr.to_loss(yy)
        if kk.size < MIN_POINTS or float(kk[-1] - kk[0]) <= 0.0:
            out[i] = _insufficient(kk, ll, tr)
        else:
            todo.append((i, kk, ll, tr))
    return out, todo


def fit_convergence(
    k: ArrayLike,
    y: ArrayLike,
    *,
    higher_is_better: bool = False,
    recency: float = RECENCY,
    family: str = DEFAULT_FAMILY,
) -> ConvergenceFit:
    """Fit a curve to ``(k, y)``; never raises on degenerate data.

    ``family`` is a name from ``FAMILIES``, or ``AUTO`` to select it on the prefix (see the
    module docstring).  NaN/inf points and negative ``k`` are dropped.  With fewer than
    ``MIN_POINTS`` left the result has ``kind="insufficient"`` (flat at the last value).
    """
    return fit_convergence_many([(k, y, higher_is_better)], recency=recency, families=[family])[0]


def fit_convergence_many(
    series: Sequence[tuple[ArrayLike, ArrayLike, bool]],
    *,
    recency: float = RECENCY,
    families: Sequence[str] | None = None,
    chunk: int = 256,
) -> list[ConvergenceFit]:
    """``fit_convergence`` for many jobs at once: one vectorised solve per chunk and family.

    ``families`` gives each series' family (``None``: the default for all); ``AUTO``
    entries are selected now (about six times the cost of a fit).  Unknown names use the
    default.
    """
    names = list(families) if families is not None else [DEFAULT_FAMILY] * len(series)
    auto = [i for i, name in enumerate(names) if name == AUTO]
    if auto:
        chosen = select_families([series[i] for i in auto], recency=recency)
        for i, name in zip(auto, chosen, strict=True):
            names[i] = name
    out, todo = _prepare(series)
    groups: dict[str, list[Prepared]] = {}
    for item in todo:
        name = names[item[0]]
        groups.setdefault(name if name in FAMILIES else DEFAULT_FAMILY, []).append(item)
    for name, items in groups.items():
        for start in range(0, len(items), chunk):
            part = items[start : start + chunk]
            for (i, *_), fit in zip(part, _fit_chunk(part, recency, name), strict=True):
                out[i] = fit
    return [f for f in out if f is not None]


def select_families(
    series: Sequence[tuple[ArrayLike, ArrayLike, bool]],
    *,
    recency: float = RECENCY,
    chunk: int = 256,
) -> list[str]:
    """Per series, the family that best predicts its own later points from its earlier ones.

    Rolling-origin holdout on the observed prefix (``HOLDOUT_ORIGINS``); only data the
    daemon already has is used.  Series too short to hold anything out get the default.
    """
    out = [DEFAULT_FAMILY] * len(series)
    _, todo = _prepare(series)
    todo = [t for t in todo if t[1].size > MIN_POINTS]
    if not todo:
        return out
    scores = {name: np.zeros(len(todo)) for name in FAMILIES}
    for frac in HOLDOUT_ORIGINS:
        cut = [min(max(int(t[1].size * frac), MIN_POINTS), t[1].size - 1) for t in todo]
        heads = [
            (j, t[1][:m], t[2][:m], t[3]) for j, (t, m) in enumerate(zip(todo, cut, strict=True))
        ]
        usable = [h for h in heads if float(h[1][-1] - h[1][0]) > 0.0]
        errs: dict[str, dict[int, Array]] = {name: {} for name in FAMILIES}
        noise: dict[int, list[float]] = {}
        for name in FAMILIES:
            for start in range(0, len(usable), chunk):
                part = usable[start : start + chunk]
                for (j, *_), fit in zip(part, _fit_chunk(part, recency, name), strict=True):
                    _, kk, ll, _ = todo[j]
                    errs[name][j] = fit.losses(kk[cut[j] :]) - ll[cut[j] :]
                    noise.setdefault(j, []).append(fit.scale)
        for j, scales in noise.items():
            # One robust scale per job for every family (the median of their residual
            # scales), and the fit's own Huber loss: a loss spike among the held-out points
            # costs every family about the same instead of deciding the choice.
            ll = todo[j][2]
            sigma = max(float(np.median(scales)), 1e-9 * float(np.ptp(ll)), 1e-300)
            for name in FAMILIES:
                u = np.abs(errs[name][j]) / sigma
                h = np.where(u <= HUBER_K, 0.5 * u * u, HUBER_K * (u - 0.5 * HUBER_K))
                scores[name][j] += float(np.mean(h))
    names = list(FAMILIES)  # the default first: argmin keeps it on ties
    table = np.stack([scores[n] for n in names])
    table = np.where(np.isfinite(table), table, np.inf)
    for j, best in enumerate(np.argmin(table, axis=0)):
        out[todo[j][0]] = names[int(best)]
    return out


def _fit_chunk(part: Sequence[Prepared], recency: float, name: str) -> list[ConvergenceFit]:
    fam = FAMILIES[name]
    J = len(part)
    N = max(kk.size for _, kk, _, _ in part)
    K = np.ones((J, N))
    L = np.zeros((J, N))
    W = np.zeros((J, N))
    mask = np.zeros((J, N), dtype=bool)
    y_scale = np.empty(J)
    k_first = np.empty(J)
    for j, (_, kk, ll, _) in enumerate(part):
        n = kk.size
        peak = max(float(np.abs(ll).max()), 1e-300)  # O(1) values keep sums precise
        y_scale[j] = peak
        K[j, :n] = kk
        K[j, n:] = kk[-1]  # padding (weight 0) inside the range keeps every basis finite
        L[j, :n] = ll / peak
        W[j, :n] = np.exp(recency * (kk - kk[-1]) / (kk[-1] - kk[0]))
        mask[j, :n] = True
        k_first[j] = kk[0]
    k_max = np.maximum(K.max(axis=1, where=mask, initial=0.0), 1e-12)
    rows = np.arange(J)
    kf3 = k_first[:, None, None]
    km3 = k_max[:, None, None]

    def basis(grid: Array) -> Array:
        return fam.x(K[:, None, :], grid[:, :, None], kf3, km3)

    coarse = fam.unit[None, :] * (k_max[:, None] if fam.relative else np.ones((J, 1)))
    x_coarse = basis(coarse)
    a, b, s = _solve_grid(x_coarse, L, W)
    best = np.argmin(s, axis=1)

    # One Huber re-weighting pass: points far outside the robust scale count less.
    pred = b[rows, best][:, None] + a[rows, best][:, None] * x_coarse[rows, best]
    resid = L - pred
    med = _masked_median(resid, mask)
    scale = 1.4826 * _masked_median(np.abs(resid - med[:, None]), mask)
    huber = np.where(
        (scale[:, None] > 1e-12) & mask,
        np.minimum(1.0, HUBER_K * scale[:, None] / np.maximum(np.abs(resid), 1e-300)),
        1.0,
    )
    W = W * huber
    a, b, s = _solve_grid(x_coarse, L, W)
    best = np.argmin(s, axis=1)

    lo = coarse[rows, np.maximum(best - 1, 0)]
    hi = coarse[rows, np.minimum(best + 1, _COARSE - 1)]
    fine = lo[:, None] * (hi / lo)[:, None] ** _FINE_FRAC[None, :]
    x_fine = basis(fine)
    fa, fb, fs = _solve_grid(x_fine, L, W)
    cs = np.concatenate([coarse, fine], axis=1)
    a = np.concatenate([a, fa], axis=1)
    b = np.concatenate([b, fb], axis=1)
    s = np.concatenate([s, fs], axis=1)
    best = np.argmin(s, axis=1)
    x_best = np.where(
        (best < _COARSE)[:, None],
        x_coarse[rows, np.minimum(best, _COARSE - 1)],
        x_fine[rows, np.maximum(best - _COARSE, 0)],
    )

    a_best = a[rows, best] * y_scale
    c_best = cs[rows, best]
    b2_best = b[rows, best] * y_scale
    n_pts = mask.sum(axis=1)
    dof = np.maximum(n_pts - 3, 1)
    limit = s[rows, best] * (1.0 + _BAND_CHI2 / dof) + 1e-15
    in_band = s <= limit[:, None]
    fitted = b2_best[:, None] + a_best[:, None] * x_best
    resid = L * y_scale[:, None] - fitted
    med = _masked_median(resid, mask)
    final_scale = 1.4826 * _masked_median(np.abs(resid - med[:, None]), mask)
    # The same as _spacing and _first_two_mean, for the whole chunk at once (n >= 3 here).
    gaps = np.diff(K, axis=1)
    spacing = _masked_median(gaps, mask[:, 1:] & (gaps > 0.0))
    spacing = np.where(np.isfinite(spacing), spacing, 1.0)
    l_first = 0.5 * (L[:, 0] + L[:, 1]) * y_scale

    fits = []
    for j, (_, kk, _, tr) in enumerate(part):
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
                l_first=float(l_first[j]),
                l_last_fit=float(fitted[j, kk.size - 1]),
                scale=float(final_scale[j]),
                band=band,
                family=name,
                spacing=float(spacing[j]),
            )
        )
    return fits


# --------------------------------------------------------------------------- criterion


def plateau_reached(
    l_before: ArrayLike, l_now: ArrayLike, l_first: ArrayLike, threshold: float = THRESHOLD
) -> NDArray[np.bool_]:
    """The window criterion: the last window's gain is at most ``threshold`` of the gain so
    far.  ``l_before = l(k - w)``, ``l_now = l(k)``, ``l_first`` all in loss space."""
    lb, ln = np.asarray(l_before, dtype=np.float64), np.asarray(l_now, dtype=np.float64)
    return lb - ln <= threshold * (np.asarray(l_first, dtype=np.float64) - ln)


def plateau_index(
    k: ArrayLike, loss: ArrayLike, *, window: float, threshold: float = THRESHOLD
) -> int | None:
    """First index of a sampled, already smoothed loss-space series meeting the criterion.

    ``l(k - w)`` is interpolated linearly between samples; ``l_first`` is the mean of the
    first two samples.  ``None`` when no sample meets it.
    """
    kk = np.asarray(k, dtype=np.float64)
    ll = np.asarray(loss, dtype=np.float64)
    if kk.size == 0:
        return None
    ok = kk >= kk[0] + window * (1.0 - 1e-12)
    before = np.interp(kk - window, kk, ll)
    hit = np.nonzero(ok & plateau_reached(before, ll, _first_two_mean(ll), threshold))[0]
    return int(hit[0]) if hit.size else None


def smooth3(y: ArrayLike) -> Array:
    """Centred 3-point mean (2 points at the ends): the criterion's smoothing of observed
    metrics, so that one noisy evaluation neither meets nor breaks it."""
    v = np.asarray(y, dtype=np.float64).ravel()
    if v.size < 3:
        return v.copy() if v.size < 2 else np.full(2, v.mean())
    total = np.convolve(v, np.ones(3), mode="same")
    count = np.full(v.size, 3.0)
    count[0] = count[-1] = 2.0
    return total / count


def observed_convergence(
    k: ArrayLike,
    y: ArrayLike,
    *,
    higher_is_better: bool = False,
    window: float | None = None,
    target: float | None = None,
    threshold: float = THRESHOLD,
) -> float | None:
    """The first observed progress at which the criterion already held, else ``None``.

    The same criterion as ``predict_convergence``, applied to what was seen instead of the
    fitted curve: a user target is met at the first report whose metric reaches it (the
    check a training script makes); the window criterion holds at the first point of the
    smoothed series (``smooth3``) meeting it.  Once it has held, the job is converged by
    its own definition (an early-stopping rule would have stopped it there), whatever a
    curve fitted to the whole prefix would extrapolate: a learning-rate drop after a
    plateau makes the later points fall again, and a fit through them puts the plateau
    far ahead although it has already happened.  ``window`` as in ``predict_convergence``.
    """
    kk, yy = _clean(k, y)
    if kk.size == 0:
        return None
    if target is not None and math.isfinite(target):
        hit = np.nonzero(yy >= target if higher_is_better else yy <= target)[0]
        return float(kk[hit[0]]) if hit.size else None
    if kk.size < MIN_POINTS:
        return None
    if window is None or not math.isfinite(window) or window <= 0.0:
        window = PATIENCE_EPOCHS * _spacing(kk)
    loss = smooth3(-yy if higher_is_better else yy)  # the criterion ignores the offset
    i = plateau_index(kk, loss, window=window, threshold=threshold)
    return float(kk[i]) if i is not None else None


def _first_k(grid: Array, holds: Callable[[Array], NDArray[np.bool_]]) -> Array:
    """Per row of parameters, the smallest ``k`` on ``grid`` (1, G) from which ``holds``
    is true, refined inside the bracketing grid step by ``_REFINE`` levels of a
    ``_SUB``-point grid (one vectorised evaluation each); ``inf`` where it never holds.
    ``holds`` must be monotone in ``k`` (false, then true), as both criteria are on a
    falling convex curve."""
    ok = holds(grid)  # (M, G)
    anyok = ok.any(axis=1)
    first = np.argmax(ok, axis=1)
    at_start = first == 0
    hi = grid[0, first][:, None]
    lo = grid[0, np.maximum(first - 1, 0)][:, None]
    rows = np.arange(hi.shape[0])
    for _ in range(_REFINE):
        sub = lo + (hi - lo) * _SUB_FRAC[None, :]  # (M, S); sub[:, -1] == hi holds
        h = holds(sub)
        j = np.argmax(h, axis=1)
        hi = sub[rows, j][:, None]
        lo = sub[rows, np.maximum(j - 1, 0)][:, None]
    k = np.where(at_start, grid[0, 0], hi[:, 0])
    return np.where(anyok, k, math.inf)


def _curve(fit: ConvergenceFit) -> Callable[[Array, Array, Array, Array], Array]:
    """The fit's family as a lean ``(k, a, c, b2) -> loss`` (no checks; every fitted or
    band shape is > 0, so the basis is finite for ``k >= 0``)."""
    x, kf, kl = FAMILIES[fit.family].x, np.float64(fit.k_first), np.float64(fit.k_last)
    return lambda k, a, c, b2: b2 + a * x(k, c, kf, kl)


def _plateau_closed(
    fit: ConvergenceFit, a: Array, c: Array, b2: Array, window: float, threshold: float
) -> Array | None:
    """The window criterion solved in closed form (Optimus, exp); None for the power law.

    With ``D = l_first - b2`` and ``t = threshold``: Optimus, ``u = k + c``, holds from the
    positive root of ``t*D*u^2 - t*(D*w + a)*u - (1 - t)*a*w``; exp, ``z = exp(-(k -
    k_first)/tau)``, holds once ``z <= t*D / (a*(exp(w/tau) - 1 + t))``.  Without any gain
    so far (``D <= 0``) a falling curve never meets it; a flat one (``a == 0``) always does.
    """
    t, w = threshold, window
    d = fit.l_first - b2
    pos = (d > 0.0) & (a > 0.0)
    safe_d = np.where(pos, d, 1.0)
    safe_a = np.where(pos, a, 1.0)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if fit.family == "optimus":
            p = t * (safe_d * w + safe_a)
            u = (p + np.sqrt(p * p + 4.0 * t * safe_d * (1.0 - t) * safe_a * w)) / (2 * t * safe_d)
            k = u - c
        elif fit.family == "exp":
            # ln(exp(w/tau) - (1 - t)), stable for large w/tau.
            log_den = w / c + np.log1p(-(1.0 - t) * np.exp(-w / c))
            k = fit.k_first - c * (np.log(t * safe_d / safe_a) - log_den)
        else:
            return None
    k = np.where(pos, k, np.where(a > 0.0, math.inf, -math.inf))  # never / from the start
    return np.maximum(k, fit.k_first + w)


def _target_closed(fit: ConvergenceFit, a: Array, c: Array, b2: Array, target_l: float) -> Array:
    """Smallest ``k >= k_first`` where ``b2 + a*x_c(k) <= target_l``, each family inverted."""
    gap = target_l - b2
    pos = (gap > 0.0) & (a > 0.0)
    ratio = np.where(pos, gap / np.where(pos, a, 1.0), 1.0)  # x at the target
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if fit.family == "optimus":
            k = 1.0 / ratio - c
        elif fit.family == "exp":
            k = fit.k_first - c * np.log(ratio)
        else:
            k = fit.k_last * (ratio ** (-1.0 / c) - _POWER_OFFSET)
    k = np.where(pos, k, np.where(gap >= 0.0, -math.inf, math.inf))  # flat: now or never
    return np.maximum(np.where(np.isnan(k), math.inf, k), fit.k_first)


def _plateau_k(
    fit: ConvergenceFit, a: Array, c: Array, b2: Array, window: float, threshold: float
) -> Array:
    """Smallest ``k >= k_first + window`` meeting the window criterion, per parameter triple.

    Closed form where there is one; else numerically: every family is falling and convex,
    so the window's gain shrinks while the gain so far grows, and the criterion holds from
    one point on.
    """
    closed = _plateau_closed(fit, a, c, b2, window, threshold)
    if closed is not None:
        return closed[:, 0]
    f = _curve(fit)
    return _first_k(
        (fit.k_first + window) * _SEARCH[None, :],
        lambda k: plateau_reached(f(k - window, a, c, b2), f(k, a, c, b2), fit.l_first, threshold),
    )


def predict_convergence(
    fit: ConvergenceFit,
    *,
    target: float | None = None,
    window: float | None = None,
    threshold: float = THRESHOLD,
) -> ConvergencePrediction | None:
    """Progress at which the criterion is met, with a band; ``None`` without a curve.

    ``window`` is in the fit's progress unit; ``None`` means ``PATIENCE_EPOCHS`` of the
    observed point spacing (5 evaluations).  A target beyond the fitted asymptote is
    *unreachable*: the prediction then falls back to the window criterion and says
    ``reachable=False`` (callers should trust it less).  Every returned value is finite:
    band ends are capped at ``BAND_CAP * k_last``.
    """
    if fit.kind == "insufficient":
        return None
    if not (math.isfinite(threshold) and 0.0 < threshold < 1.0):
        threshold = THRESHOLD
    if window is None or not math.isfinite(window) or window <= 0.0:
        window = PATIENCE_EPOCHS * fit.spacing
    members = ((fit.a, fit.c, fit.b2), *fit.band)
    a, c, b2 = (np.array(v, dtype=np.float64)[:, None] for v in zip(*members, strict=True))
    target_l: float | None = None
    if target is not None and math.isfinite(target):
        target_l = float(fit.transform.to_loss(target))
    ks = _target_closed(fit, a, c, b2, target_l)[:, 0] if target_l is not None else None
    # Reachable: the fitted curve gets there (a falling curve approaches b2, never passes).
    reachable = ks is None or target_l is None or fit.b2 < target_l or bool(np.isfinite(ks[0]))
    if ks is None or not reachable:
        target_l = None
        ks = _plateau_k(fit, a, c, b2, window, threshold)
    cap = BAND_CAP * max(fit.k_last, 1.0)
    ks = np.minimum(ks, max(cap, fit.k_first + window))
    k = float(ks[0])
    return ConvergencePrediction(
        k=k,
        lo=float(min(ks.min(), k)),
        hi=float(max(ks.max(), k)),
        mode="target" if target_l is not None else "plateau",
        reachable=reachable,
    )
