"""Closed-form write amplification of uniform random overwrites, to validate the simulator.

Model: Desnoyers' analytic model of FIFO (LRU) cleaning under uniform random writes
("Analytic Modeling of SSD Write Performance", SYSTOR 2012). With spare factor ``op`` =
(physical - logical) / logical and alpha = 1 + op, a page survives the time it takes the log to
wrap with probability u, the valid fraction of the victim, which solves

    u = exp(-alpha * (1 - u))        (u = -W(-alpha e^-alpha) / alpha, W the Lambert W function)

and WAF = 1 / (1 - u). Greedy cleaning meets the same value as reclaim units grow: with many
pages per RU an RU's valid fraction becomes a deterministic, decreasing function of its age, so
the emptiest RU is the oldest one and greedy picks what FIFO picks. With small RUs greedy does
somewhat better, which the validation tests allow for by using RUs of 64 pages or more.
"""

from __future__ import annotations

import math


def victim_valid_fraction(op: float) -> float:
    """The non-trivial root u in (0, 1) of u = exp(-(1 + op)(1 - u))."""
    if not op > 0:
        raise ValueError(f"op must be > 0 (spare pages per logical page), got {op!r}")
    alpha = 1.0 + op
    f = lambda u: u - math.exp(-alpha * (1.0 - u))  # noqa: E731
    lo, hi = 0.0, 1.0 - 1e-12  # f(0) < 0; f just below 1 is > 0 because alpha > 1
    for _ in range(200):
        mid = (lo + hi) / 2
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def greedy_uniform_waf(op: float) -> float:
    """WAF of uniform random single-page overwrites at spare factor ``op`` (see the module)."""
    return 1.0 / (1.0 - victim_valid_fraction(op))
