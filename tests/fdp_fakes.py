"""A raw-block core on a regular file that stands in for an NVMe namespace with FDP, for the
host tests of placement: the device's reclaim unit handle status is a fixed list, and every
``put_many`` records the placement identifier each key was written with.

The configuration keeps what the user asked for (passthrough, checkpoint placement id), so the
plugin's and the MP adapter's checks run as they would on a device; the core underneath opens
the file with io_uring without passthrough, where placement identifiers are accepted and not
sent anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lmcache_rawblock.raw_block import RawBlockCore

# (placement id, reclaim unit handle id) as an emulated controller with five handles reports them.
REPORTED = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]


class FdpCoreOnFile(RawBlockCore):
    reported: list = REPORTED

    def __init__(self, config: Any, *, key_namespace: str) -> None:
        self.asked = config
        on_file = dataclasses.replace(config, use_uring_cmd=False, meta_checkpoint_placement_id=None,
                                      max_data_transfer_size=0)
        super().__init__(on_file, key_namespace=key_namespace)
        self.meta_checkpoint_placement_id = config.meta_checkpoint_placement_id
        self.placed: dict[str, int | None] = {}  # encoded key -> placement id of its write
        self.put_calls: list[list] = []

    def fetch_fdp_status(self) -> list[tuple[int, int]]:
        return list(self.reported)

    def put_many(self, keys, objs, placement_ids=None):
        pids = [None] * len(keys) if placement_ids is None else list(placement_ids)
        self.put_calls.append(pids)
        for k, p in zip(keys, pids):
            self.placed[k.encoded] = p
        return super().put_many(keys, objs, placement_ids=placement_ids)
