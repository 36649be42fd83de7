"""Synthetic write streams of a few workload classes, each on its own part of the drive: the
validation workloads and the published anchors.

A class owns ``space`` (a fraction of the space in use) and receives ``share`` of the host
writes, either ``random`` (uniform overwrites of ``size`` pages at random aligned positions:
hash buckets, or slots reused at random) or ``sequential`` (a circular log written ``size``
pages at a time: log-structured regions). ``util`` is the fraction of the drive's logical space
in use; the rest is never written, so it acts as extra spare space. In ``mixed`` mode every
write goes to one placement handle; in ``separated`` mode each class has its own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from .ftl import FlashSim, Geometry

RANDOM = "random"
SEQUENTIAL = "sequential"


@dataclass(frozen=True)
class WriteClass:
    name: str
    space: float
    share: float
    pattern: str = RANDOM
    size: int = 1  # pages per write

    def __post_init__(self) -> None:
        if not 0 < self.space <= 1:
            raise ValueError(f"class {self.name}: space must be in (0, 1], got {self.space!r}")
        if not 0 <= self.share <= 1:
            raise ValueError(f"class {self.name}: share must be in [0, 1], got {self.share!r}")
        if self.pattern not in (RANDOM, SEQUENTIAL):
            raise ValueError(f"class {self.name}: pattern must be random or sequential, got {self.pattern!r}")
        if self.size < 1:
            raise ValueError(f"class {self.name}: size must be >= 1 page, got {self.size!r}")


def run_classes(geometry: Geometry, classes: Sequence[WriteClass], *, util: float = 1.0, separated: bool,
                warmup: float = 2.0, measure: float = 2.0, policy: str = "greedy", isolation: str = "initial",
                seed: int = 1) -> dict:
    """Fill the space in use sequentially, then write ``warmup`` + ``measure`` drive writes (of
    the space in use) of the classes' mix; WAF over the measured part, and from the start."""
    if abs(sum(c.space for c in classes) - 1.0) > 1e-9:
        raise ValueError(f"class spaces must add up to 1, got {sum(c.space for c in classes)!r}")
    if abs(sum(c.share for c in classes) - 1.0) > 1e-9:
        raise ValueError(f"class shares must add up to 1, got {sum(c.share for c in classes)!r}")
    if not 0 < util <= 1:
        raise ValueError(f"util must be in (0, 1], got {util!r}")
    sim = FlashSim(geometry, policy=policy, isolation=isolation)
    used = int(geometry.logical_pages * util)
    rnd = random.Random(seed)
    spans = []
    start = 0
    for c in classes:
        n = max(c.size, int(used * c.space) // c.size * c.size)
        spans.append((start, n))
        start += n
    if start > geometry.logical_pages:
        raise ValueError(f"classes need {start} pages, the drive has {geometry.logical_pages}")
    pid = [i + 1 if separated else 1 for i in range(len(classes))]
    heads = [0] * len(classes)
    for i, (s, n) in enumerate(spans):  # preconditioning: a sequential fill
        for p in range(s, s + n, classes[i].size):
            sim.write(p, min(classes[i].size, s + n - p), pid[i])
    cum = [{"drive_writes": 1.0, "waf": sim.counters.waf()}]
    shares = [c.share for c in classes]
    cut = []
    acc = 0.0
    for sh in shares:
        acc += sh
        cut.append(acc)

    def write_pages(total: int) -> None:
        done = 0
        while done < total:
            r = rnd.random()
            i = next(k for k, v in enumerate(cut) if r < v or k == len(cut) - 1)
            c, (s, n) = classes[i], spans[i]
            if c.pattern == RANDOM:
                p = s + rnd.randrange(n // c.size) * c.size
            else:
                p = s + heads[i]
                heads[i] = (heads[i] + c.size) % n
            k = min(c.size, s + n - p)
            sim.write(p, k, pid[i])
            done += k

    dw = 1.0
    for phase, amount in (("warmup", warmup), ("measure", measure)):
        if phase == "measure":
            sim.mark()
        left = amount
        while left > 1e-9:
            step = min(1.0, left)
            write_pages(int(step * used))
            left -= step
            dw += step
            cum.append({"drive_writes": round(dw, 3), "waf": sim.counters.waf()})
    return {"waf": sim.window().waf(), "cumulative_waf": sim.counters.waf(), "cumulative": cum,
            "util": util, "separated": separated, "classes": [c.__dict__ for c in classes]}


def cumulative_at(result: dict, drive_writes: float) -> float:
    """The WAF from the start up to ``drive_writes`` drive writes (the nearest point recorded)."""
    return min(result["cumulative"], key=lambda c: abs(c["drive_writes"] - drive_writes))["waf"]
