"""The GPU backends' one translation from pinned host addresses to the addresses their kernels use.

A :class:`HostAliasMap` is built from a backend's live host registrations (chunks sorted by address, each
with its device offset) and answers for many addresses at once (one ``searchsorted``) or for a tensor's
byte range; the shared GPU layer caches one per pin generation.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.host_registration import HostRegistration

__all__ = ["HostAliasMap"]


class HostAliasMap:
    """Pinned host chunks sorted by address, each with ``device alias - host address`` (its offset).

    Args:
        registrations: the backend's live host registrations.
        backend_name: names the backend in error messages.
        use_alias: ``capabilities.host_pointer_alias``: kernels must use each chunk's device alias (ROCm;
            CUDA where device attribute 91 is unset). When False the device uses host addresses (CUDA
            unified addressing) and translation only checks that the memory is pinned.
    """

    def __init__(self, registrations: Iterable[HostRegistration], backend_name: str, use_alias: bool) -> None:
        chunks = sorted(
            ((chunk.address, chunk.address + chunk.size, chunk.device_alias, owner)
             for owner, record in enumerate(registrations) for chunk in record.chunks),
            key=lambda c: c[0],
        )
        self.backend_name = backend_name
        self.use_alias = use_alias
        self._starts = [c[0] for c in chunks]
        self._ends = [c[1] for c in chunks]
        self._aliases = [c[2] for c in chunks]
        self._owners = [c[3] for c in chunks]
        self._start_tensor = torch.tensor(self._starts, dtype=torch.int64)
        self._end_tensor = torch.tensor(self._ends, dtype=torch.int64)
        self._offset_tensor = torch.tensor(
            [0 if alias is None else alias - start for start, alias in zip(self._starts, self._aliases, strict=True)],
            dtype=torch.int64,
        )
        self._aliased = torch.tensor([alias is not None for alias in self._aliases], dtype=torch.bool)

    def __len__(self) -> int:
        return len(self._starts)

    def translate(self, host_addresses: torch.Tensor, member: str) -> torch.Tensor:
        """The device address of every host address (vectorized: one ``searchsorted``, no Python loop).

        Args:
            host_addresses: 1-D int64 CPU tensor of addresses inside pinned host memory.
            member: the public member asking, for error messages.

        Returns:
            A new int64 tensor of the same shape (the input is not modified).

        Raises:
            InvalidArgumentError: not a 1-D int64 CPU tensor, or an address outside every pinned chunk (the
                first is named with its index).
            UnsupportedCapabilityError: kernels need an alias and the chunk holding an address recorded none.
        """
        if not isinstance(host_addresses, torch.Tensor) or host_addresses.dtype != torch.int64 \
                or host_addresses.device.type != "cpu" or host_addresses.dim() != 1:
            got = (f"{host_addresses.dtype} shape {tuple(host_addresses.shape)} on {host_addresses.device}"
                   if isinstance(host_addresses, torch.Tensor) else type(host_addresses).__name__)
            raise InvalidArgumentError(f"{member}: expected a 1-D int64 CPU tensor of host addresses, got {got}")
        if host_addresses.numel() == 0:
            return host_addresses.clone()
        if not self._starts:
            raise InvalidArgumentError(
                f"{member}: address {int(host_addresses[0]):#x} (index 0) is not in a pinned host tensor; "
                f"nothing is pinned on backend {self.backend_name!r}"
            )
        index = torch.searchsorted(self._start_tensor, host_addresses, right=True).sub_(1)
        safe = index.clamp_min(0)
        inside = (index >= 0) & (host_addresses < self._end_tensor.take(safe))
        if not bool(inside.all()):
            i = int((~inside).nonzero()[0])
            raise InvalidArgumentError(
                f"{member}: address {int(host_addresses[i]):#x} (index {i}) is not inside a tensor pinned by "
                f"backend {self.backend_name!r}; pin it with pin_tensor first"
            )
        if not self.use_alias:
            return host_addresses.clone()
        aliased = self._aliased.take(safe)
        if not bool(aliased.all()):
            i = int((~aliased).nonzero()[0])
            raise self._no_alias(member, self._starts[int(safe[i])])
        return host_addresses + self._offset_tensor.take(safe)

    def translate_range(self, start: int, end: int, member: str) -> int:
        """The device address of ``start`` for bytes ``[start, end)`` that a kernel reads as one array.

        The bytes must lie in one registration, in chunks whose device aliases are contiguous.

        Raises:
            InvalidArgumentError: the range is not inside one pinned registration, or spans chunks whose
                aliases are not contiguous.
            UnsupportedCapabilityError: kernels need an alias and a chunk of the range recorded none.
        """
        first = bisect.bisect_right(self._starts, start) - 1
        last = bisect.bisect_left(self._starts, end) - 1  # the last chunk starting before ``end``
        if not self._one_registration(first, last, start, end):
            raise InvalidArgumentError(
                f"{member}: host tensor at {start:#x} ({end - start} bytes) is not inside memory pinned by "
                f"backend {self.backend_name!r}; pin_tensor the host pool first"
            )
        if not self.use_alias:
            return start
        aliases = self._aliases[first:last + 1]
        if any(alias is None for alias in aliases):
            raise self._no_alias(member, self._starts[first])
        offsets = {alias - chunk for alias, chunk in zip(aliases, self._starts[first:last + 1], strict=True)
                   if alias is not None}
        if len(offsets) != 1:
            raise InvalidArgumentError(
                f"{member}: host tensor [{start:#x}, {end:#x}) spans {len(aliases)} registration chunks whose "
                "device aliases are not contiguous; pass a view inside one chunk"
            )
        return start + offsets.pop()

    def _one_registration(self, first: int, last: int, start: int, end: int) -> bool:
        """Whether chunks ``first..last`` cover ``[start, end)`` without a gap, all of one registration."""
        if first < 0 or start >= self._ends[first] or end > self._ends[last]:
            return False
        owner = self._owners[first]
        return all(self._owners[k + 1] == owner and self._ends[k] == self._starts[k + 1] for k in range(first, last))

    def _no_alias(self, member: str, chunk: int) -> UnsupportedCapabilityError:
        return UnsupportedCapabilityError(
            f"{member}: the registration of host memory at {chunk:#x} recorded no device alias, but backend "
            f"{self.backend_name!r}'s capabilities say kernels must use one (host_pointer_alias); re-pin the "
            "tensor with a runtime that reports it"
        )
