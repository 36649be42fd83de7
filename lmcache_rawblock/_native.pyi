"""Type stubs for the C extension lmcache_rawblock._native."""

from collections.abc import Callable, Container, Iterable, Sequence
from os import PathLike
from types import TracebackType
from typing import Any, Literal, Self, final

from typing_extensions import Buffer

__version__: str

def xxh3_64(data: Buffer, /) -> int: ...
def probe_foreign(path: str | PathLike[str], /) -> str | None: ...
def encode_legacy_keys(keys: Iterable[object], /) -> list[str]:
    """``[k if isinstance(k, str) else k.to_string() for k in keys]``; LMCache's
    CacheEngineKey / LayerCacheEngineKey are encoded in C (anything else calls to_string())."""
def delete_legacy_keys(core: object, keys: Iterable[object], force: bool = False) -> int:
    """``core`` is a ``_native.Core``: ``core.delete_many(encode_legacy_keys(keys), force).count(True)``
    without creating the str objects."""
def settings() -> tuple[dict[str, Any], ...]:
    """The core's settings table: one dict per setting (name, type, min, max, default, choices,
    lmcache, required, config, plugin, nonpositive_is_zero, clamp_to_min, power_of_two,
    none_is_zero, policy, lmcache_mp, help), in RawBlockCoreConfig's order, then the FDP
    placement-policy settings (policy=True; type "id_list" is a list of distinct integers).
    Core() takes exactly the names that are not policy settings."""
def nvme_fdp_report(path: str | PathLike[str], /) -> dict[str, Any]:
    """An NVMe namespace (ngXnY or nvmeXnY) and its FDP state: nsid, lba_size, size_bytes,
    endgid, fdp_enabled, config (index, fdpa, nrg, nruh, maxpids, nnss, runs) or None, ruhs
    (pid, ruhid, earutr, ruamw per reclaim unit handle), stats (hbmw, mbmw, mbe) or None."""
def nvme_wear_counters(path: str | PathLike[str], /) -> dict[str, Any]:
    """Wear counters of an NVMe namespace (ngXnY or nvmeXnY): nsid, endgid, fdp_enabled,
    smart (data_units_written, data_units_read in units of 1000 x 512 bytes,
    host_write_commands, host_read_commands; low 64 bits), fdp_stats (hbmw, mbmw, mbe bytes)
    or None when FDP is off or unsupported, fdp_events (host, controller: events the drive
    holds, at most 63 each; by_type: {event type: count}) or None.
    ValueError when path is not an NVMe namespace; OSError (with the path) when it cannot be
    opened or an ioctl fails."""
def container_bytes(meta_total_bytes: int, block_align: int, /) -> int:
    """Bytes of one of the two checkpoint copies; container 1 starts at this offset."""
def read_metadata_log(
    path: str | PathLike[str], block_align: int, meta_total_bytes: int = 0, threads: int = 2
) -> dict[str, Any]:
    """The log-format metadata region of a device read back (superblocks, base, log, the entries
    they replay to); found=False when no superblock of ours is there. Only reads."""
def _set_memobj_type(cls: type | None, /) -> None:
    """Read payloads of exactly this MemoryObj class through raw_data.data_ptr() and get_size()."""
def _set_write_log(path: str | PathLike[str] | None, /) -> None:
    """Test hook: record every device write and flush to path (None stops)."""
def _set_write_journal(path: str | PathLike[str] | None, /) -> None:
    """Record every device write's offset and length (not its bytes), deallocation and flush to
    path (None stops): the write journal ``waf replay --record`` feeds to the wear simulator."""
def _inject_lock_errno(errnum: int, /) -> None:
    """Test hook: the next flock(2) a device makes fails with errnum (0 clears)."""
def _forget_key_plans() -> None:
    """Drop the cached key-encoding plans (tests: the next call re-checks against to_string())."""

@final
class RawBlockDevice:
    """A raw block device or pre-sized file; drop-in for lmcache_rust_raw_block_io.RawBlockDevice."""

    def __new__(
        cls,
        path: str | PathLike[str],
        writable: bool,
        use_odirect: bool = False,
        use_iouring: bool = False,
        use_uring_cmd: bool = False,
        alignment: int = 4096,
        io_engine: str | None = None,
        iouring_queue_depth: int = 256,
        max_data_transfer_size: int | None = None,
        *,
        lock: Literal["check", "shared", "exclusive", "none"] | None = None,
        io_scheduler: Literal["loads_first", "fifo"] | None = None,
        read_max_bytes_in_flight: int | None = None,
        write_max_bytes_in_flight: int | None = None,
        write_piece_bytes: int | None = None,
    ) -> Self:
        """lock (ours): None/"check" refuses (OSError EBUSY) a device another process's raw-block
        writer holds, holding nothing; "shared" holds flock LOCK_SH (readers); "exclusive" holds
        LOCK_EX, plus O_EXCL on a block device (writers outside a core); "none" neither.
        io_scheduler and the three byte budgets (ours): the io_uring scheduler, as the core's
        settings of those names (None: the defaults)."""
    @property
    def closed(self) -> bool: ...
    @property
    def device_lock(self) -> Literal["none", "shared", "exclusive", "unsupported", "released"]: ...
    @property
    def io_engine(self) -> str: ...
    @property
    def use_odirect(self) -> bool: ...
    @property
    def alignment(self) -> int: ...
    def size_bytes(self) -> int: ...
    def pwrite_from_buffer(
        self, offset: int, data: Buffer, payload_len: int | None = None, total_len: int | None = None
    ) -> None: ...
    def pread_into(self, offset: int, out: Buffer, payload_len: int, total_len: int | None = None) -> None: ...
    def batched_write(
        self,
        offsets: Sequence[int],
        buffers: Sequence[Buffer],
        total_lens: Sequence[int],
        placement_ids: Sequence[int | None] | None = None,
        payload_lens: Sequence[int] | None = None,
    ) -> int: ...
    def batched_read(self, offsets: Sequence[int], buffers: Sequence[Buffer], total_lens: Sequence[int]) -> int: ...
    def wait_iouring(self, batch_id: int) -> tuple[list[bool], list[tuple[int, str]]]: ...
    def read_uring(self, offset: int, data: Buffer, payload_len: int, total_len: int | None = None) -> None: ...
    def write_uring(
        self,
        offset: int,
        data: Buffer,
        payload_len: int,
        total_len: int | None = None,
        placement_id: int | None = None,
    ) -> None: ...
    def register_fixed_buffers(self, buffer_ptrs: Sequence[int], buffer_sizes: Sequence[int]) -> None: ...
    def worker_error(self) -> str | None: ...
    def _inject_nowait_miss(self, n: int, /) -> None:
        """Test hook: the next n no-wait attempts of small buffered transfers give up."""
    def _inject_engine_fault(self, kinds: int, /) -> None:
        """Test hook: 1 = the next kernel submission fails hard after the kernel took the requests,
        2 = reaping fails from then on."""
    def _hold_engine(self, on: bool, /) -> None:
        """Test hook: the io_uring worker leaves new requests queued while on."""
    def _fail_engine_write(self, nth: int, /) -> None:
        """Test hook: the nth write attempt to complete from now on (0 clears) reports EIO."""
    def _trace_engine(self, n: int, /) -> list[tuple[str, int, int, bool]]:
        """Test hook: (op, offset, length, ended its request) of each attempt completed since
        the last call, in completion order; then record the next n (0 stops)."""
    def fixed_buffer_status(self) -> tuple[bool, int]: ...
    def io_stats_snapshot(self) -> dict[str, int]: ...
    def io_scheduler(self) -> dict[str, Any] | None:
        """The io_uring scheduler in effect: io_scheduler and the three byte budgets (defaults
        filled in, the piece rounded); None without io_uring."""
    def nvme_nsid(self) -> int: ...
    def nvme_lba_shift(self) -> int: ...
    def nvme_lba_size(self) -> int: ...
    def fetch_fdp_status(self) -> list[tuple[int, int]]: ...
    def max_data_transfer_size(self) -> int:
        """Bytes per NVMe command on a passthrough device; longer transfers are split."""
    def write_streams(self) -> int:
        """io_uring write streams placing writes on FDP handles through the block device
        (Linux >= 6.16, O_DIRECT); 0 when there are none."""
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool: ...

@final
class Core:
    """The C core: index, slots, checkpoints, recovery and the device. Built by RawBlockCore."""

    def __new__(cls, **settings: object) -> Self:
        """Keyword-only: one keyword per entry of settings() (device_path and slot_bytes are
        required; the others default to the table's). A wrong type is a TypeError, a value out
        of range or a bad geometry a ValueError, each naming the setting and the value; a
        device holding someone else's data is refused unless allow_foreign_device."""
    # ---- keys and payloads
    def put_many(
        self, keys: Sequence[str], identities: Sequence[int], payloads: Sequence[object],
        placement_ids: Sequence[int | None], metas: object,
    ) -> tuple[list[bool], list[int], BaseException | None]:
        """(results, indices of the keys stored by this call in commit order, why the first
        refused key failed or None)."""
    def load_many_into(
        self, keys: Sequence[str], payloads: Sequence[object], set_positions: object = None
    ) -> tuple[list[bool], list[BaseException | None] | None]:
        """With set_positions (what RawBlockCore passes): (results, per-key errors or None when no
        key failed), each loaded key's cached positions set on its payload's metadata. Without it:
        (results, cached positions, per-key errors). A miss is False."""
    def exists_many(self, keys: Sequence[str], lock: bool = False) -> list[bool]: ...
    def delete_many(self, keys: Sequence[str], force: bool = False) -> list[bool]:
        """Deletes; with deallocate_freed on, then deallocates the slots it made reusable."""
    def unlock_many(self, keys: Sequence[str], /) -> None: ...
    def get_metadata_many(self, keys: Sequence[str], /) -> list[tuple[object, ...] | None]: ...
    def get_metadata_prefix(
        self, keys: Sequence[str], lock: bool = False, skip: Container[str] | None = None
    ) -> list[tuple[object, ...]]:
        """``skip``: keys that end the prefix as if they were missing (``key in skip``)."""
    def exists_inflight(self, key: str, /) -> bool: ...
    def entry_offset(self, key: str, /) -> int | None: ...
    def lock_refcount(self, key: str, /) -> int: ...
    def snapshot_keys(self, limit: int | None = None) -> list[str]: ...
    # ---- metadata
    def checkpoint_now(self, force: bool = True) -> bool:
        """True when a checkpoint was written; then deallocates the slots it made reusable."""
    def release_held_slots(self) -> bool:
        """Make the slots deletes freed reusable (log format: their FREE records alone when that
        is enough); True when something was written."""
    def reclaim_held_slots(self) -> int:
        """release_held_slots again while freed slots wait and the last call wrote, at most 3
        times, one caller at a time: the checkpoints written."""
    def compact_metadata(self) -> bool: ...
    def apply_state_json(self, state: Buffer, /) -> tuple[bool, str]: ...
    # ---- state
    def status(self) -> dict[str, Any]: ...
    def trust_counters(self) -> tuple[int, int, int, int]: ...
    def counts(self) -> tuple[int, ...]:
        """The slot and extent figures of status() from one hold of the core mutex, in the order
        usable_slots, indexed, inflight, free, next_slot, held, locked, room_checkpoints, closed
        (0 or 1), then the extent_* / extents_* integers (see RawBlockCore.extent_counts)."""
    def histograms(self) -> dict[str, Any]: ...
    def set_histograms(self, on: object, /) -> None: ...
    def load_queue(self) -> tuple[int, int, int, int, int]:
        """(read_pending_bytes, write_pending_bytes, inflight_bytes, read_completed_bytes,
        write_completed_bytes): reads and writes submitted to the io_uring scheduler and not
        finished (0 under posix); this core's loads and puts in flight; the device's completed
        bytes per direction."""
    def _recording_cost_ns(self, iterations: int, keys: int, uring: object = True, /) -> int: ...
    def engine_state(self) -> tuple[bool, int, str | None]: ...
    def io_scheduler(self) -> dict[str, Any] | None:
        """As RawBlockDevice.io_scheduler, for the core's device."""
    def mem_bytes(self) -> int: ...
    def nvme_info(self) -> dict[str, Any] | None:
        """Passthrough only: nsid, lba_shift, lba_size, max_data_transfer_size, size_bytes,
        dsm_supported, dsm_max_ranges, dsm_max_range_blocks, deallocated_reads."""
    def fetch_fdp_status(self) -> list[tuple[int, int]]: ...
    def register_buffers(self, ptrs: Sequence[int], sizes: Sequence[int]) -> None: ...
    def set_dealloc_log(self, on: bool, /) -> None:
        """Start (cleared) or stop the journal of ranges deallocated for freed slots."""
    def extent_victim(self) -> tuple[int, list[str], list[bool]] | None:
        """Extents on (extent_bytes): (extent, keys, hot) of the closed extent used least
        recently, without the keys a load or pin holds; hot[i]: key i was loaded since it was
        put. None when no closed extent holds a key. The extent then counts as just used.
        RuntimeError when extents are off."""
    def extent_peek(self, count: int, /) -> list[tuple[int, list[str], list[bool]]]:
        """As extent_victim for up to count (1 to 64) closed extents holding a key, in victim
        order (the first is the one extent_victim takes), without counting them as used; fewer
        when there are fewer. One pass over the extents."""
    def extent_take(self, extent: int, /) -> tuple[int, list[str], list[bool]] | None:
        """As extent_victim for the given extent (counted as just used and as a victim); None
        when it is not a closed extent holding a key."""
    def extent_evict(self, reserve: int, batch: int = 1, keep_hot: bool = False, keys: bool = False,
                     reclaim: bool = False) -> tuple[int, int, list[str] | None, list[str], int, int, tuple[int, ...],
                                                     BaseException | None]:
        """The extent evictor's pass in one call without the GIL: (extents, deleted, gone, hot,
        opened, reclaimed, counts, error). When fewer than reserve extents are clean or waiting
        for their deallocation, the keys of as many victims as are missing, at least batch, are
        deleted as delete_many deletes them; keep_hot keeps its hot keys (listed in hot), keys
        lists the deleted ones (gone, else None), reclaim runs reclaim_held_slots after it when
        no hot key was kept
        (reclaimed: its checkpoints, -1 when it did not run). counts: as counts() after it;
        error: what the reclaim failed with. RuntimeError when extents are off."""
    def free_lane_off(self) -> None:
        """For tests and benchmarks: every FREE record goes in line behind pending puts' records."""
    def discard_force_ioctl(self) -> None:
        """For tests: a block device's discards take BLKDISCARD from now on."""
    def take_dealloc_log(self) -> list[tuple[int, int]]:
        """(offset, length) of each range deallocated since the journal was started or last taken."""
    def close(self) -> dict[str, Any]: ...
    # ---- test and benchmark hooks (not a stable API)
    def _apply_state_json_generic(self, state: Buffer, /) -> tuple[bool, str]: ...
    def _inject_engine_fault(self, kinds: int, /) -> None: ...
    def _hold_engine(self, on: bool, /) -> None: ...
    def _fail_engine_write(self, nth: int, /) -> None: ...
    def _trace_engine(self, n: int, /) -> list[tuple[str, int, int, bool]]: ...
    def _inject_fault(self, kind: str, countdown: int) -> None: ...
    @staticmethod
    def _key_identity(key: str, namespace: str) -> int: ...
    def _revalidate(self, sequential: bool, /) -> int: ...
    def _set_checkpoint_delay_ms(self, ms: int, /) -> None: ...
    def _set_checkpoint_no_flush(self, on: bool, /) -> None: ...
    def _set_load_check_off(self, off: bool, /) -> None: ...
    def _set_load_delay_ms(self, ms: int, /) -> None: ...
    def _set_metadata_shortcut(self, cls: type, descr: object, attr: str, /) -> None: ...

@final
class PrefixOrder:
    """Chains of stored keys and their eviction order (lmcache_rawblock.prefix_evict). Keys are
    str (a subclass is copied to a str); a method given one that is not refuses the whole call
    (TypeError) before it changes anything. Not re-entrant (a victims() predicate may not call
    it)."""

    def __init__(self, hint_capacity: int = 65536) -> None: ...
    def note_call(self, encoded: Sequence[str], /) -> None:
        """The keys of one store call, in prompt order: each one's predecessor is the key
        before it (the first's, a link a lookup left, if any); a stored head the call names
        after its first key is linked here."""
    def note_lookup(self, encoded: Sequence[str], hits: int, /) -> None:
        """A lookup of ``encoded`` that found the first ``hits``: the first missing key follows
        the last hit; hits without a known predecessor are linked to the key before them."""
    def note_links(self, links: Iterable[tuple[str, str]], /) -> None:
        """(key, predecessor) pairs known for keys not stored now (read before they left)."""
    def add(self, key: str, /) -> None: ...
    def add_many(self, keys: Iterable[str], /) -> None:
        """``keys`` were stored (those stored already were used again: only their recency moves)."""
    def add_recovered(self, keys: Iterable[str], /) -> None:
        """Keys found on the device (oldest first) not known yet: heads, evicted before every
        key learned since."""
    def touch(self, key: str, /) -> None:
        """``key`` was loaded: the most recently used of the leaves."""
    def remove(self, key: str, /) -> None: ...
    def remove_many(self, keys: Iterable[str], /) -> None:
        """``keys`` left the tier: their stored children become unreachable (until stored again),
        their predecessors may become leaves (not one leaving in the same batch)."""
    def victims(self, want: int, skip: Callable[[str], bool] | Container[str], /) -> list[str]:
        """Up to ``want`` keys to evict, in order: unreachable keys and what hangs below them,
        then leaves oldest first, each followed by the predecessors its eviction turns into
        leaves; if every leaf is kept, keys below them, newest stored first. ``skip`` names keys
        that must stay: a predicate or a container (a set is cheapest)."""
    def unreachable(self, skip: Callable[[str], bool] | Container[str], /) -> list[str]:
        """Every stored key a lookup can no longer reach, none that ``skip`` names."""
    def probe_bound(self, encoded: Sequence[str], /) -> int:
        """How many of a prompt's keys a lookup needs to probe: up to the first one whose
        predecessor is known to have left."""
    def reachable_loss(self, keys: Iterable[str], limit: int | None = None, /) -> int:
        """How many stored keys a lookup reaches now would be lost if ``keys`` left (those of
        them reachable, and every stored key below one of them); counting stops at ``limit``
        (the result is then ``limit``)."""
    def predecessor(self, key: str, /) -> str | None: ...
    def is_unreachable(self, key: str, /) -> bool: ...
    def counts(self) -> dict[str, int]:
        """prefix_keys, prefix_leaves, prefix_unreachable, prefix_pending_links."""
    def __len__(self) -> int: ...
    def __contains__(self, key: object, /) -> bool: ...
