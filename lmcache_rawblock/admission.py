"""Write admission for the SSD tier: write a chunk only once it has been asked to be stored
before (``rust_raw_block.admission = second_hit``), so chunks used once never wear the drive.

The counts live in a count-min sketch of fixed size (``depth`` rows of ``width`` one-byte
saturating counters: 4 x 65536 = 256 KiB by default, whatever the number of keys). Every
``width * 8`` recorded keys the counters are halved, so the sketch follows the recent workload
and an old count does not admit a key forever (the aging of TinyLFU). A count-min sketch only
over-estimates, so a key seen before is always admitted; a key seen for the first time may be
admitted early when it collides with others (rarely, at the default size).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

ALWAYS = "always"
SECOND_HIT = "second_hit"
POLICIES = (ALWAYS, SECOND_HIT)

_MASK64 = (1 << 64) - 1
_SEEDS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
          0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x27D4EB2F165667C5, 0x85EBCA77C2B2AE63)


_HALVE = bytes(b >> 1 for b in range(256))


def _mix(x: int) -> int:
    # splitmix64's finaliser: every input bit moves every output bit.
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


class FrequencySketch:
    """Approximate per-key counts in bounded memory (see the module docstring)."""

    def __init__(self, width: int = 1 << 16, depth: int = 4, *, halve_every: int | None = None) -> None:
        if not isinstance(width, int) or width < 16 or width & (width - 1):
            raise ValueError(f"sketch width must be a power of two >= 16, got {width!r}")
        if not isinstance(depth, int) or not 1 <= depth <= len(_SEEDS):
            raise ValueError(f"sketch depth must be in 1..{len(_SEEDS)}, got {depth!r}")
        self.width, self.depth = width, depth
        self._rows = [bytearray(width) for _ in range(depth)]
        self.halve_every = halve_every if halve_every is not None else width * 8
        if self.halve_every < 1:
            raise ValueError(f"sketch halve_every must be >= 1, got {halve_every!r}")
        self._recorded = 0

    @property
    def nbytes(self) -> int:
        return self.width * self.depth

    def _cells(self, key: Hashable):
        h = key if isinstance(key, int) else hash(key)
        mask = self.width - 1
        return [(row, _mix((h ^ seed) & _MASK64) & mask) for row, seed in zip(self._rows, _SEEDS)]

    def estimate(self, key: Hashable) -> int:
        return min(row[i] for row, i in self._cells(key))

    def record(self, key: Hashable) -> int:
        """Count one more occurrence of ``key``; return its estimated count including this one."""
        cells = self._cells(key)
        est = min(row[i] for row, i in cells)
        if est < 255:
            for row, i in cells:  # conservative update: raise only the minimum cells
                if row[i] == est:
                    row[i] = est + 1
            est += 1
        self._recorded += 1
        if self._recorded >= self.halve_every:
            self._recorded = 0
            for row in self._rows:
                row[:] = row.translate(_HALVE)
        return est


class Admission:
    """``always``: every write is admitted. ``second_hit``: a key is admitted the second time it
    is offered (and after), counted in a :class:`FrequencySketch`. Thread-safe."""

    def __init__(self, policy: str = ALWAYS, *, width: int = 1 << 16, depth: int = 4) -> None:
        if policy not in POLICIES:
            raise ValueError(f"admission must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.policy = policy
        self.sketch = FrequencySketch(width, depth) if policy == SECOND_HIT else None
        self._lock = threading.Lock()
        self.offered = 0
        self.rejected = 0

    def admit(self, key: Hashable) -> bool:
        if self.sketch is None:
            self.offered += 1
            return True
        with self._lock:
            self.offered += 1
            if self.sketch.record(key) >= 2:
                return True
            self.rejected += 1
            return False

    def status(self) -> dict:
        return {"admission": self.policy, "admission_offered": self.offered, "admission_rejected": self.rejected,
                "admission_sketch_bytes": self.sketch.nbytes if self.sketch else 0}
