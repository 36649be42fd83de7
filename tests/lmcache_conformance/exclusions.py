"""LMCache tests that are not expected to pass in the compat or native mode, with the reason.

Every other test that passes in the baseline mode (LMCache on the Rust wheel) must pass in
both other modes, or ``run.py`` fails. An entry that starts passing is reported, not an error.

``kind`` is one of:

``private``
    The test patches LMCache's private internals (a fake device planted in ``sys.modules``,
    private methods of LMCache's ``RawBlockCore`` such as ``_rawdev``), which our C core never
    calls, so the patch has no effect on our stack. ``covered_by`` names a test of ours that
    checks the same public behaviour on a real file.
``differs``
    Our behaviour differs from LMCache's on purpose (docs/compatibility.md).
    ``covered_by`` names the test of ours that pins our behaviour.

``test`` is a pytest node id relative to the sdist's root; ``fnmatch`` patterns are allowed
(e.g. ``...::test_x[*]`` for every parameter set).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exclusion:
    modes: tuple[str, ...]
    test: str
    kind: str
    reason: str
    covered_by: str


EXCLUSIONS: list[Exclusion] = []

# Node ids name the files where the newest LMCache of the matrix has them; RENAMED maps a file of
# an older layout to that name (0.5.7 moved the raw-block tests to tests/v1/distributed/raw_block/),
# and ``current_nodeid`` applies it, so one entry covers every version.
RENAMED = {
    f"tests/v1/storage_backend/test_raw_block_{name}.py": f"tests/v1/distributed/raw_block/test_{name}.py"
    for name in ("core", "device", "key_codec", "fdp_checkpoint_probe", "fdp_status_probe")
}


def current_nodeid(nodeid: str) -> str:
    """``nodeid`` with its file named as in the newest layout (unchanged when it did not move)."""
    path, sep, rest = nodeid.partition("::")
    return RENAMED.get(path, path) + sep + rest


CORE = "tests/v1/distributed/raw_block/test_core.py::"
BACKEND = "tests/v1/storage_backend/test_rust_raw_block_backend.py::"
URING_CMD = "tests/v1/storage_backend/test_raw_block_uring_cmd.py::"
OURS_CORE = "tests/core/test_core.py::"
OURS_URING = "tests/core/test_core_uring.py::"
OURS_PLUGIN = "tests/plugin/test_plugin.py::"
OURS_EQUIV = "tests/conformance/test_conformance_equivalents.py::"
NATIVE = ("native",)

FAKE_RAWDEV = ("replaces the device LMCache's core obtains from its private _rawdev() with a recording "
               "fake; our C core opens and drives its own device and never calls _rawdev")
FAKE_MODULE = ("plants a fake lmcache_rust_raw_block_io in sys.modules and asserts the calls LMCache's "
               "core makes on it; our C core never imports that module")
WRAPPED_DEVICE = ("wraps lmcache_rust_raw_block_io.RawBlockDevice in a recorder to count the batches "
                  "LMCache's core submits; our C core never calls the Python device class")
NO_PASSTHROUGH = ("drives LMCache's core's own passthrough chunking through its private methods on a fake "
                  "device; our C core splits transfers at the limit in its engine, tested on the emulated NVMe "
                  "device")


def _private(test: str, why: str, covered_by: str) -> Exclusion:
    return Exclusion(NATIVE, test, "private", why, covered_by)


EXCLUSIONS += [
    # --- LMCache's io_uring put path, observed through a fake device behind _rawdev().
    _private(CORE + "test_raw_block_core_io_uring_put_many_single_submit", FAKE_RAWDEV
             + "; our put path also submits a chunk's payloads and headers as one batch",
             OURS_URING + "test_put_many_writes_payloads_and_headers_in_one_batch"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_chunks_large_batches", FAKE_RAWDEV,
             OURS_URING + "test_put_many_chunks_large_batches"),
    _private(CORE + "test_raw_block_core_io_uring_header_buffer_length_guard", FAKE_RAWDEV,
             OURS_URING + "test_put_many_round_trip_odd_sizes"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_round_trip", FAKE_RAWDEV,
             OURS_URING + "test_put_many_round_trip_odd_sizes"),
    _private(CORE + "test_raw_block_core_io_uring_padded_odirect_uses_batched_write", FAKE_RAWDEV,
             OURS_URING + "test_uring_odirect_put_and_load_with_bounces"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_skips_already_indexed", FAKE_RAWDEV,
             OURS_URING + "test_put_many_skips_already_indexed"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_all_or_nothing_rollback", FAKE_RAWDEV,
             OURS_URING + "test_put_many_rolls_back_on_submission_failure"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_partial_submission_rolls_back", FAKE_RAWDEV,
             OURS_URING + "test_put_many_rolls_back_on_submission_failure"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_completion_failure_rolls_back", FAKE_RAWDEV,
             OURS_URING + "test_put_many_payload_completion_failure_rolls_back_the_chunk"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_partial_slot_exhaustion", FAKE_RAWDEV,
             OURS_URING + "test_put_many_partial_slot_exhaustion"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_duplicate_keys_in_batch", FAKE_RAWDEV,
             OURS_URING + "test_put_many_duplicate_keys_in_batch"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_oversize_key_isolated", FAKE_RAWDEV,
             OURS_URING + "test_put_many_oversize_key_isolated"),
    _private(CORE + "test_raw_block_core_io_uring_put_many_prep_failure_leaves_no_orphan",
             FAKE_RAWDEV + ", and patches the private _prepare_write_payload",
             OURS_URING + "test_put_many_prep_failure_leaves_no_orphan_and_slot_is_reused"),
    _private(CORE + "test_raw_block_core_posix_put_many_uses_sequential_pwrite", FAKE_RAWDEV,
             OURS_CORE + "test_posix_put_many_uses_sequential_pwrite"),
    _private(CORE + "test_raw_block_core_iouring_load_batch_roundtrip[[]*[]]", WRAPPED_DEVICE,
             OURS_URING + "test_uring_odirect_put_and_load_with_bounces"),
    # --- io_uring worker health, injected through a fake device.
    _private(CORE + "test_raw_block_core_rejects_work_after_terminal_worker_failure", FAKE_RAWDEV,
             OURS_EQUIV + "test_terminal_worker_failure_makes_the_core_refuse_work"),
    _private(CORE + "test_raw_block_core_request_error_does_not_mark_worker_failed", FAKE_RAWDEV,
             OURS_EQUIV + "test_request_error_does_not_mark_the_worker_failed"),
    # --- recovery validation: LMCache's private header readers.
    _private(CORE + "test_raw_block_core_uses_bounded_posix_recovery_read_tasks",
             "patches the private _validate_loaded_entries / _read_slot_header; our recovery runs in C",
             "tests/core/test_core_format.py::test_verify_on_load_drops_bad_headers"),
    _private(CORE + "test_raw_block_core_iouring_recovery_does_not_use_posix_threads",
             "patches the private _validate_loaded_entries / _read_slot_headers_batched; our recovery runs in C",
             OURS_URING + "test_recovery_validation_uring_batches_with_odirect"),
    _private(CORE + "test_validate_loaded_entries_*_uses_batched_reader",
             "patches the private _read_slot_headers_batched / _read_slot_header; our recovery runs in C",
             OURS_URING + "test_recovery_validation_uring_batches_with_odirect"),
    _private(CORE + "test_read_slot_headers_batched_reads_and_decodes_one_batch",
             "calls the private _read_slot_headers_batched on a fake device behind _rawdev()",
             OURS_URING + "test_recovery_validation_uring_batches_with_odirect"),
    _private(CORE + "test_read_slot_headers_batched_splits_by_iouring_queue_depth",
             "calls the private _read_slot_headers_batched on a fake device behind _rawdev()",
             OURS_URING + "test_recovery_validation_uring_batches_with_odirect"),
    _private(CORE + "test_read_slot_headers_batched_falls_back_per_slot_on_batch_error[[]*[]]",
             "calls the private _read_slot_headers_batched on a fake device behind _rawdev()",
             OURS_EQUIV + "test_recovery_header_read_failure_keeps_the_other_entries"),
    _private(CORE + "test_read_slot_headers_batched_retries_only_failed_completion[[]*[]]",
             "calls the private _read_slot_headers_batched on a fake device behind _rawdev()",
             OURS_EQUIV + "test_recovery_header_read_failure_keeps_the_other_entries"),
    # --- slot affinity (placement ids), fixed buffers and checkpoint placement on a fake device.
    _private(CORE + "test_raw_block_core_reuses_free_slot_with_matching_placement_id", FAKE_MODULE,
             OURS_CORE + "test_affinity_reuses_matching_pid"),
    _private(CORE + "test_raw_block_core_falls_back_and_rebinds_slot_placement_id", FAKE_MODULE,
             OURS_CORE + "test_affinity_fallback_rebinds_and_none_clears"),
    _private(CORE + "test_raw_block_core_omitted_placement_clears_previous_affinity", FAKE_MODULE,
             OURS_CORE + "test_affinity_fallback_rebinds_and_none_clears"),
    _private(CORE + "test_raw_block_core_slot_affinity_none_preserves_global_lifo", FAKE_MODULE,
             OURS_CORE + "test_lifo_reuse_without_affinity"),
    _private(CORE + "test_raw_block_core_put_many_preserves_none_and_positive_placement", FAKE_MODULE,
             OURS_URING + "test_put_many_placement_ids_drive_slot_affinity"),
    _private(CORE + "test_raw_block_core_put_many_sets_same_placement_for_header_and_payload", FAKE_MODULE,
             OURS_URING + "test_put_many_placement_ids_drive_slot_affinity"),
    _private(CORE + "test_raw_block_core_put_many_rejects_zero_placement_before_io", FAKE_MODULE,
             OURS_EQUIV + "test_put_many_rejects_zero_placement_before_io"),
    _private(CORE + "test_raw_block_core_checkpoint_uses_metadata_placement_id", FAKE_MODULE,
             OURS_URING + "test_checkpoint_written_through_uring_payload_then_header"),
    _private(CORE + "test_raw_block_core_checkpoint_batches_padded_metadata_write", FAKE_MODULE,
             OURS_URING + "test_checkpoint_written_through_uring_payload_then_header"),
    _private(CORE + "test_raw_block_core_register_fixed_range_splits_at_one_gib", FAKE_MODULE,
             OURS_URING + "test_register_fixed_buffers_from_allocator"),
    _private(CORE + "test_raw_block_core_reports_failed_registration", FAKE_MODULE,
             OURS_URING + "test_register_fixed_buffers_noop_and_warnings"),
    # --- NVMe passthrough: LMCache's private chunking on a fake device.
    _private(CORE + "test_raw_block_core_uring_cmd_*_uses_aligned_chunks", NO_PASSTHROUGH,
             "tests/nvme/test_passthrough_device.py::test_split_round_trip_lands_on_the_namespace"),
    _private(CORE + "test_raw_block_core_put_many_*_uring_cmd_*", NO_PASSTHROUGH,
             "tests/nvme/test_passthrough_core.py::test_round_trip_with_split_transfers_and_recovery"),
    _private(BACKEND + "test_raw_block_core_uring_cmd_*", NO_PASSTHROUGH,
             "tests/nvme/test_passthrough_core.py::test_round_trip_with_split_transfers_and_recovery"),
    _private(URING_CMD + "test_uring_cmd_auto_transfer_limit_*",
             "patches LMCache's private RawBlockCore._rawdev / _ensure_capacity_and_layout and its module's "
             "_read_sysfs_int; ours resolves the limit in lmcache_rawblock.raw_block.config",
             "tests/nvme/test_passthrough_config.py::test_transfer_limit_capped_by_max_segments"),
    _private(URING_CMD + "test_uring_cmd_explicit_transfer_limit_must_be_block_aligned",
             "patches LMCache's private RawBlockCore._rawdev / _ensure_capacity_and_layout / "
             "_load_checkpoint_from_device",
             "tests/nvme/test_passthrough_config.py::test_explicit_transfer_limit_must_be_block_aligned"),
    _private(URING_CMD + "test_uring_cmd_disabled",
             "patches RawBlockCore._rawdev / _ensure_capacity_and_layout / _load_checkpoint_from_device and "
             "the plugin's private _raw", "tests/core/test_core_config.py::test_uring_cmd_rejects_block_or_regular_file"),
    # --- LMCache's core on a fake device module (test_rust_raw_block_backend.py).
    _private(BACKEND + "test_raw_block_core_iouring_read_rejects_short_completion_bitmap[[]*[]]", FAKE_MODULE,
             OURS_URING + "test_load_many_uring_errors"),
    _private(BACKEND + "test_raw_block_core_iouring_write_rejects_short_completion_bitmap[[]*[]]",
             FAKE_MODULE + ", and calls the private _write_buffers",
             OURS_URING + "test_put_many_payload_completion_failure_rolls_back_the_chunk"),
    _private(BACKEND + "test_raw_block_core_load_many_into_batches_iouring_reads", FAKE_MODULE,
             OURS_URING + "test_load_many_batches_by_queue_depth"),
    _private(BACKEND + "test_raw_block_core_logs_iouring_completion_errors", FAKE_MODULE,
             OURS_URING + "test_load_many_uring_errors"),
    _private(BACKEND + "test_raw_block_core_non_odirect_rejects_payload_over_slot_capacity", FAKE_MODULE,
             OURS_CORE + "test_oversize_key_isolated"),
    _private(BACKEND + "test_raw_block_core_odirect_prepare_payload_boundaries",
             FAKE_MODULE + ", and calls the private _prepare_write_payload",
             OURS_EQUIV + "test_odirect_payload_boundaries_at_slot_capacity"),
    _private(BACKEND + "test_raw_block_core_passes_io_engine_options_to_rust_binding",
             FAKE_MODULE + " (it records the device constructor's keyword arguments)",
             OURS_EQUIV + "test_io_engine_options_reach_the_device"),
    # --- the plugin over LMCache's core internals.
    _private(BACKEND + "test_rust_raw_block_backend_batched_get_returns_none_on_rawdev_error",
             "makes the core's private _rawdev() raise; our core has no such method (and our plugin raises a "
             "read error where LMCache 0.5.6 returns None)",
             OURS_PLUGIN + "test_get_releases_allocations_on_read_error"),
    _private(BACKEND + "test_rust_raw_block_backend_batched_get_releases_allocation_on_read_error", FAKE_RAWDEV,
             OURS_PLUGIN + "test_get_releases_allocations_on_read_error"),
    _private(BACKEND + "test_rust_raw_block_backend_batched_get_returns_loaded_prefix_on_read_error",
             FAKE_RAWDEV + "; note that our plugin raises the read error (load_many_into with "
             "raise_on_error=True) where LMCache 0.5.6 returns the loaded prefix",
             OURS_PLUGIN + "test_get_releases_allocations_on_read_error"),
    _private(BACKEND + "test_rust_raw_block_backend_batched_submit_rolls_back_refs_on_dispatch_failure",
             FAKE_MODULE, OURS_PLUGIN + "test_submit_rolls_back_refs_on_dispatch_failure"),
    _private(BACKEND + "test_rust_raw_block_backend_batched_submit_rolls_back_only_unscheduled_refs",
             FAKE_MODULE, OURS_PLUGIN + "test_submit_rolls_back_only_unscheduled_refs"),
    _private(BACKEND + "test_rust_raw_block_backend_skips_failed_worker_without_retaining_objects",
             FAKE_MODULE + " (its worker_error() is patched)",
             OURS_EQUIV + "test_plugin_skips_puts_after_worker_failure_without_keeping_objects"),
    _private(BACKEND + "test_rust_raw_block_backend_skips_checkpoint_on_init",
             "patches the private RawBlockCore._select_latest_checkpoint",
             OURS_PLUGIN + "test_skips_checkpoint_on_init"),
    # --- deliberate differences.
    Exclusion(NATIVE, CORE + "test_raw_block_core_does_not_restore_slot_affinity_from_checkpoint", "differs",
              "a slot listed by the last checkpoint is not reused until a newer checkpoint no longer lists it "
              "(a crash cannot make the checkpoint point at another key's bytes); the test expects the deleted "
              "key's slot to be handed out again at once", OURS_CORE
              + "test_slot_listed_by_a_checkpoint_is_not_reused_until_rewritten"),
    Exclusion(NATIVE, BACKEND + "test_rust_raw_block_backend_recovers_legacy_key_dtype", "differs",
              "with meta_verify_on_load=False an entry recovered without validation has its slot header checked "
              "at its first load; the test applies a checkpoint entry whose slot was never written, which LMCache "
              "serves (zeros) and we treat as a miss", "tests/core/test_core_hazards.py::"
              "test_unverified_entry_with_torn_header_is_a_miss"),
    Exclusion(NATIVE, BACKEND + "test_rust_raw_block_backend_warns_on_cross_rank_metadata_load", "differs",
              "our plugin logs the cross-rank warning through its own logger with its own wording; the test "
              "patches LMCache's module logger and matches LMCache's text",
              OURS_PLUGIN + "test_warns_on_cross_rank_device"),
]
