"""The GPU gather's device-side id check in two Triton launches, with no read-back.

Launch 1 turns row ids into in-range source row indices (clamped, remapped to the source's strides) and
keeps, per program, the first out-of-range id; launch 2 folds those into the fault record of
:mod:`hisparse_hal.gather` if it is still clear. Both buffers are made once, when the backend is built.
"""

from __future__ import annotations

import functools
import os
import types

import torch

__all__ = ["TritonIdCheck", "MAX_PROGRAMS", "triton_check_available"]

#: Programs of launch 1 at most (each then strides over the ids); launch 2 reads one slot pair per program.
MAX_PROGRAMS = 1024
_BLOCK = 1024


def triton_check_available(device: torch.device) -> bool:
    """Whether :class:`TritonIdCheck` can run on ``device``: triton imports and the device is a GPU, or
    the kernels are defined for triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors in tests)."""
    try:
        module = _kernels()
    except ImportError:
        return False
    return device.type == "cuda" or module.INTERPRETED


@functools.lru_cache(maxsize=1)
def _kernels() -> types.SimpleNamespace:
    """The kernels, defined on first use (importing triton; ``TRITON_INTERPRET`` is read then)."""
    import triton
    import triton.language as tl

    @triton.jit
    def check_ids_kernel(ids_ptr, index_ptr, scratch_ptr, n, total, block_size, block_step, offset_step,
                         REMAP: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        first_pos = tl.zeros((), dtype=tl.int64) + n  # n: no bad id seen
        first_val = tl.zeros((), dtype=tl.int64)
        for start in range(pid * BLOCK, n, programs * BLOCK):
            offs = start + tl.arange(0, BLOCK).to(tl.int64)
            live = offs < n
            ids = tl.load(ids_ptr + offs, mask=live, other=0).to(tl.int64)
            bad = live & ((ids < -1) | (ids >= total))
            row = tl.minimum(tl.maximum(ids, 0), total - 1)  # -1 reads row 0; bad ids a clamped row
            if REMAP:
                row = (row // block_size) * block_step + (row % block_size) * offset_step
            tl.store(index_ptr + offs, row, mask=live)
            pos = tl.min(tl.where(bad, offs, n), axis=0)
            val = tl.sum(tl.where(bad & (offs == pos), ids, 0), axis=0)
            earlier = pos < first_pos
            first_val = tl.where(earlier, val, first_val)
            first_pos = tl.where(earlier, pos, first_pos)
        tl.store(scratch_ptr + 2 * pid, first_pos)
        tl.store(scratch_ptr + 2 * pid + 1, first_val)

    @triton.jit
    def record_fault_kernel(scratch_ptr, record_ptr, programs, n, total, block_size, PROGRAMS: tl.constexpr):
        slot = tl.arange(0, PROGRAMS)
        used = slot < programs
        pos = tl.load(scratch_ptr + 2 * slot, mask=used, other=n)
        val = tl.load(scratch_ptr + 2 * slot + 1, mask=used, other=0)
        first = tl.min(pos, axis=0)
        value = tl.sum(tl.where(used & (pos == first) & (first < n), val, 0), axis=0)
        fault = (first < n) & (tl.load(record_ptr) == 0)  # the record keeps the first fault until read
        tl.store(record_ptr + 1, first, mask=fault)
        tl.store(record_ptr + 2, value, mask=fault)
        tl.store(record_ptr + 3, tl.zeros((), dtype=tl.int64) + total, mask=fault)
        tl.store(record_ptr + 4, tl.zeros((), dtype=tl.int64) + block_size, mask=fault)
        tl.store(record_ptr, tl.zeros((), dtype=tl.int64) + 1, mask=fault)

    return types.SimpleNamespace(
        check_ids_kernel=check_ids_kernel,
        record_fault_kernel=record_fault_kernel,
        INTERPRETED=os.environ.get("TRITON_INTERPRET", "0") == "1",
    )


class TritonIdCheck:
    """Row ids to source row indices, with out-of-range ids recorded on the device (two launches).

    Args:
        record: the fault record to keep bad ids in (:func:`~hisparse_hal.gather.new_fault_record`, read by
            :func:`~hisparse_hal.gather.raise_recorded_fault`); the per-program scratch is allocated beside it,
            here, once: build this with the backend, outside any capture.
    """

    def __init__(self, record: torch.Tensor) -> None:
        self.record = record
        self._scratch = torch.empty(2 * MAX_PROGRAMS, dtype=torch.int64, device=record.device)

    def __call__(self, row_ids: torch.Tensor, total: int, block_size: int, block_step: int,
                 offset_step: int) -> torch.Tensor:
        """Indices into the source's row view for ``row_ids`` (a new int64 tensor), recording in
        :attr:`record` the first out-of-range id of the first gather that had one."""
        n = row_ids.numel()
        index = torch.empty(n, dtype=torch.int64, device=row_ids.device)
        programs = max(1, min(MAX_PROGRAMS, -(-n // _BLOCK)))
        kernels = _kernels()
        remap = block_step != block_size or offset_step != 1
        kernels.check_ids_kernel[(programs,)](row_ids, index, self._scratch, n, total, block_size, block_step,
                                              offset_step, REMAP=remap, BLOCK=_BLOCK)
        kernels.record_fault_kernel[(1,)](self._scratch, self.record, programs, n, total, block_size,
                                          PROGRAMS=MAX_PROGRAMS)
        return index
