"""Hot paths of the simulated cycle written for speed give exactly the numbers of the
plain formulas they replace (a different last bit could change a tie in the policy)."""

from __future__ import annotations

import bisect
import math
import random

from slurm_elastic.model.throughput import _LN2, ScalingParams, ThroughputFit


def _plain_correction(fit: ThroughputFit, n: float) -> float:
    if not fit.knots:
        return 0.0
    x = math.log(max(float(n), 1e-9))
    x0, c0 = fit.knots[0]
    x1, c1 = fit.knots[-1]
    if x <= x0:
        return c0 * 0.5 ** ((x0 - x) / _LN2)
    if x >= x1:
        return c1 * 0.5 ** ((x - x1) / _LN2)
    i = bisect.bisect_right(fit.knots, (x, math.inf))
    (xa, ca), (xb, cb) = fit.knots[i - 1], fit.knots[i]
    return ca + (cb - ca) * (x - xa) / (xb - xa)


def _plain_throughput(fit: ThroughputFit, n: float) -> float:
    """ThroughputFit.throughput as first written: smooth model, correction, blend."""
    smooth = math.log(fit.params.throughput(n)) + _plain_correction(fit, n)
    kn = fit.knots
    x = math.log(max(float(n), 1e-9))
    if len(kn) < 2 or kn[0][0] <= x <= kn[-1][0]:
        return math.exp(smooth)
    (xa, ca), (xb, cb) = (kn[1], kn[0]) if x < kn[0][0] else (kn[-2], kn[-1])
    ya = math.log(fit.params.throughput(math.exp(xa))) + ca
    yb = math.log(fit.params.throughput(math.exp(xb))) + cb
    slope = min(1.0, max(-1.0, (yb - ya) / (xb - xa)))
    line = yb + slope * (x - xb)
    w = 0.5 ** (abs(x - xb) / _LN2)
    return math.exp(w * line + (1.0 - w) * smooth)


def test_throughput_is_bit_identical_to_the_plain_formula() -> None:
    rng = random.Random(2)
    for _ in range(300):
        params = ScalingParams(*(rng.choice((0.0, rng.uniform(0.0, 5.0))) for _ in range(4)))
        sizes = sorted(rng.sample(range(1, 65), rng.randrange(0, 5)))
        knots = tuple((math.log(s), rng.uniform(-2.0, 2.0)) for s in sizes)
        fit = ThroughputFit(params, tuple(sizes), len(sizes), 0.1, knots)
        for n in (0, 0.5, 1, 2, 3, 7, 8, 16, 33, 64, 100, 128, 1e7):
            assert fit.throughput(n) == _plain_throughput(fit, n)
            assert fit.correction(n) == _plain_correction(fit, n)
