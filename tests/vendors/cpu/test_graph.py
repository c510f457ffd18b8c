"""Graph capture and replay on the CPU reference device."""

from __future__ import annotations

import threading

import pytest
import torch

from hisparse_hal import KVCacheConfig, LayerSpec
from hisparse_hal.errors import CaptureMisuseError, InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.vendors.cpu.backend import CpuBackend

BLOCK = 656


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend()


@pytest.fixture
def pool_and_source(backend):
    source = torch.randint(0, 256, (8, BLOCK), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    pool = torch.zeros(8, BLOCK, dtype=torch.uint8)
    backend.register_region(source.data_ptr(), source.numel(), "source")
    backend.pin_tensor(pool)
    return pool, source


def _swap_args(source: torch.Tensor, pool: torch.Tensor, rows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = torch.tensor(rows)
    return source.data_ptr() + rows * BLOCK, pool.data_ptr() + rows * BLOCK, torch.full((len(rows),), BLOCK)


def test_capturing_is_false_outside_true_inside_and_false_after(backend):
    assert backend.is_current_stream_capturing() is False
    with backend.capture() as graph:
        assert backend.is_current_stream_capturing() is True
    assert backend.is_current_stream_capturing() is False
    assert graph.status == "complete" and graph.operations == ()
    graph.replay()


def test_capture_state_belongs_to_the_capturing_thread(backend):
    seen = []
    with backend.capture():
        thread = threading.Thread(target=lambda: seen.append(backend.is_current_stream_capturing()))
        thread.start()
        thread.join(10)
    assert seen == [False]


def test_captured_swap_runs_only_on_replay_with_descriptors_read_at_call_time(backend, pool_and_source):
    pool, source = pool_and_source
    src, dst, sizes = _swap_args(source, pool, [0, 5])
    with backend.capture() as graph:
        backend.swap_blocks_batch(src, dst, sizes)
        src.fill_(source.data_ptr() + 7 * BLOCK)  # the caller reuses its arrays: the graph keeps the old values
    assert graph.operations == ("swap_blocks_batch",)
    assert pool.eq(0).all()
    graph.replay()
    assert torch.equal(pool[0], source[0]) and torch.equal(pool[5], source[5])
    pool.zero_()
    graph.replay()
    assert torch.equal(pool[0], source[0]) and torch.equal(pool[5], source[5])


def test_captured_gather_runs_only_on_replay_and_reads_ids_in_place(backend):
    cache = torch.randint(0, 256, (4, 2, BLOCK), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    staging = torch.zeros(3, BLOCK, dtype=torch.uint8)
    ids = torch.tensor([1, -1, 7])
    with backend.capture() as graph:
        backend.gather_resident_rows(cache, staging, ids)
    assert graph.operations == ("gather_resident_rows",) and staging.eq(0).all()
    graph.replay()
    rows = cache.view(8, BLOCK)
    assert torch.equal(staging, rows[torch.tensor([1, 0, 7])])
    ids.copy_(torch.tensor([6, 5, 4]))  # a GPU graph keeps the ids' address, so replay sees new ids
    graph.replay()
    assert torch.equal(staging, rows[torch.tensor([6, 5, 4])])


def test_replay_runs_captured_operations_in_order(backend, pool_and_source):
    pool, source = pool_and_source
    staging = torch.zeros(1, BLOCK, dtype=torch.uint8)
    with backend.capture() as graph:
        backend.swap_blocks_batch(*_swap_args(source, pool, [2]))
        backend.gather_resident_rows(pool.view(8, 1, BLOCK), staging, torch.tensor([2]))
    graph.replay()
    assert torch.equal(staging[0], source[2])


NOT_CAPTURABLE = {
    "pin_tensor": lambda b: b.pin_tensor(torch.zeros(64, dtype=torch.uint8)),
    "unpin_tensor": lambda b: b.unpin_tensor(torch.zeros(64, dtype=torch.uint8)),
    "register_region": lambda b: b.register_region(0x1000, 64),
    "unregister_region": lambda b: b.unregister_region(None),
    "prepare_kv_cache_views": lambda b: b.prepare_kv_cache_views(
        KVCacheConfig("bf16", 1, 1, 8, (LayerSpec("l"),)), {"l": torch.zeros(16, dtype=torch.uint8)}, {}),
    "create_ipc_event": lambda b: b.create_ipc_event(),
    "export_event": lambda b: b.export_event(None),
    "import_event": lambda b: b.import_event(torch.device("cpu"), b""),
}


@pytest.mark.parametrize("member", sorted(NOT_CAPTURABLE))
def test_uncapturable_member_raises_capture_misuse_and_the_capture_still_replays(backend, pool_and_source, member):
    pool, source = pool_and_source
    regions_before = list(backend.regions)
    with backend.capture() as graph:
        backend.swap_blocks_batch(*_swap_args(source, pool, [1]))
        with pytest.raises(CaptureMisuseError, match=f"{member} cannot run while the current stream is capturing"):
            NOT_CAPTURABLE[member](backend)
        assert backend.is_current_stream_capturing()
        backend.swap_blocks_batch(*_swap_args(source, pool, [3]))
    assert list(backend.regions) == regions_before and len(backend.pinned_registrations()) == 1
    graph.replay()
    assert torch.equal(pool[1], source[1]) and torch.equal(pool[3], source[3])


def test_event_record_and_wait_are_refused_while_capturing_but_query_is_allowed(backend):
    event = backend.create_ipc_event()
    try:
        with backend.capture():
            for member in ("record", "wait", "synchronize"):
                with pytest.raises(CaptureMisuseError, match=f"CpuIpcEvent.{member} cannot run while"):
                    getattr(event, member)()
            assert event.query()
    finally:
        event.close()


def test_validating_a_kv_config_is_allowed_while_capturing(backend):
    with backend.capture():
        backend.validate_kv_cache_config(KVCacheConfig("fp8_ds_mla", 1, 1, 656, (LayerSpec("l"),)))


def test_nested_capture_is_rejected_and_the_outer_capture_survives(backend, pool_and_source):
    pool, source = pool_and_source
    with backend.capture() as graph:
        with pytest.raises(CaptureMisuseError, match="already capturing; nested captures are not supported"):
            with backend.capture():
                pass  # pragma: no cover
        assert backend.is_current_stream_capturing()
        backend.swap_blocks_batch(*_swap_args(source, pool, [4]))
    graph.replay()
    assert torch.equal(pool[4], source[4])


def test_capture_whose_body_raises_ends_capturing_and_cannot_replay(backend, pool_and_source):
    pool, source = pool_and_source
    with pytest.raises(ZeroDivisionError):
        with backend.capture() as graph:
            backend.swap_blocks_batch(*_swap_args(source, pool, [0]))
            raise ZeroDivisionError("the block fails after recording a swap")
    assert backend.is_current_stream_capturing() is False and graph.status == "failed"
    with pytest.raises(CaptureMisuseError, match="replay\\(\\) of a capture whose block raised"):
        graph.replay()
    assert pool.eq(0).all()


def test_replay_inside_the_capture_block_or_another_capture_is_rejected(backend):
    with backend.capture() as graph:
        with pytest.raises(CaptureMisuseError, match=r"replay\(\) called before the capture ended"):
            graph.replay()
    with backend.capture():
        with pytest.raises(
            CaptureMisuseError, match="CpuGraph.replay cannot run while the current stream is capturing"
        ):
            graph.replay()


def test_invalid_swap_or_gather_while_capturing_is_rejected_and_not_recorded(backend, pool_and_source):
    pool, source = pool_and_source
    staging = torch.zeros(1, BLOCK, dtype=torch.uint8)
    with backend.capture() as graph:
        with pytest.raises(
            InvalidDescriptorError, match="descriptor 0: source range .* is not inside any known region"
        ):
            backend.swap_blocks_batch(torch.tensor([16]), torch.tensor([pool.data_ptr()]), torch.tensor([8]))
        with pytest.raises(InvalidArgumentError, match=r"row_ids\[0\] = 8 is out of range"):
            backend.gather_resident_rows(pool.view(8, 1, BLOCK), staging, torch.tensor([8]))
        with pytest.raises(InvalidArgumentError, match="gather destination is on meta"):
            backend.gather_resident_rows(pool.view(8, 1, BLOCK), staging.to("meta"), torch.tensor([0]))
    assert graph.operations == ()
    assert staging.eq(0).all() and pool.eq(0).all()


def test_replay_after_a_captured_region_was_released_is_rejected_and_replays_nothing(backend, pool_and_source):
    pool, source = pool_and_source
    other = torch.zeros(BLOCK, dtype=torch.uint8)
    backend.pin_tensor(other)
    with backend.capture() as graph:
        backend.swap_blocks_batch(*_swap_args(source, pool, [6]))
        backend.swap_blocks_batch(
            torch.tensor([source.data_ptr()]), torch.tensor([other.data_ptr()]), torch.tensor([BLOCK])
        )
    backend.unpin_tensor(other)
    with pytest.raises(
        InvalidDescriptorError,
        match=r"replay: a captured swap uses region 'pinned host .*released after the capture; nothing was replayed",
    ):
        graph.replay()
    assert pool.eq(0).all() and other.eq(0).all()


def test_replay_with_ids_now_out_of_range_is_rejected_and_replays_nothing(backend, pool_and_source):
    pool, source = pool_and_source
    staging = torch.zeros(1, BLOCK, dtype=torch.uint8)
    ids = torch.tensor([0])
    with backend.capture() as graph:
        backend.swap_blocks_batch(*_swap_args(source, pool, [0]))
        backend.gather_resident_rows(source.view(8, 1, BLOCK), staging, ids)
    ids.fill_(99)
    with pytest.raises(
        InvalidArgumentError,
        match=r"replay: captured gather row_ids\[0\] = 99 is out of range: ids must be -1 \(not resident\) "
        r"or in \[0, 8\).*nothing was replayed",
    ):
        graph.replay()
    assert pool.eq(0).all() and staging.eq(0).all()


def _invalidate_args(backend) -> tuple[torch.Tensor, ...]:
    """vLLM 0.34.0's invalidation: the table by address (registered with the backend), rows and slots."""
    dgi = torch.tensor([[5, 6, 7, -1], [5, 9, -1, -1]], dtype=torch.int32)
    backend.register_cache_op_table(dgi)
    pointers = torch.tensor([dgi.data_ptr()], dtype=torch.int64)
    state = torch.tensor([1, 0], dtype=torch.int32)  # request row 0 uses state row 1, row 1 state row 0
    req_id_per_token = torch.tensor([0, 1], dtype=torch.int32)
    written = torch.tensor([5, 5], dtype=torch.int64)
    return dgi, pointers, state, req_id_per_token, written


def test_captured_cache_op_runs_on_replay_with_the_values_written_in_place(backend):
    ops = backend.create_cache_ops(runtime=None)
    dgi, pointers, state, req_id_per_token, written = _invalidate_args(backend)
    with backend.capture() as graph:
        ops.hisparse_invalidate_written_slots(pointers, state, req_id_per_token, written, 2, 4)
    assert graph.operations == ("invalidate_written_slots",)
    assert dgi.tolist() == [[5, 6, 7, -1], [5, 9, -1, -1]]  # nothing ran during the capture
    written.copy_(torch.tensor([9, 6]))  # the step's written rows, updated in place before the replay
    graph.replay()
    # token 0 (request row 0 -> state row 1) clears 9 there; token 1 (row 1 -> state row 0) clears 6; the 5s
    # that the capture-time values named stay.
    assert dgi.tolist() == [[5, -1, 7, -1], [5, -1, -1, -1]]


def test_cache_op_with_bad_arguments_is_refused_at_capture_and_records_nothing(backend):
    ops = backend.create_cache_ops(runtime=None)
    dgi, pointers, state, req_id_per_token, written = _invalidate_args(backend)
    with backend.capture() as graph:
        with pytest.raises(InvalidArgumentError, match=r"written_slots.*int64"):
            ops.hisparse_invalidate_written_slots(pointers, state, req_id_per_token, written.to(torch.int32), 2, 4)
    assert graph.operations == ()
    graph.replay()
    assert dgi.tolist() == [[5, 6, 7, -1], [5, 9, -1, -1]]
