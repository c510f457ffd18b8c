"""A swap batch expressed against guarded ranges, its descriptors, and the bytes it must produce.

Invariant: the expected image is computed independently of any backend (plain tensor indexing on CPU
snapshots), and a plan never lets one copy's destination overlap another copy's source or destination,
so the expected result does not depend on the order in which a backend runs the copies.
"""

from __future__ import annotations

import torch

from .arenas import GuardedBytes, describe_mismatch

__all__ = ["SwapPlan"]

# Expected images are built byte by byte (vectorized) for many small copies, copy by copy otherwise.
_BYTE_INDEX_LIMIT = 4 << 20
_LOOP_COUNT = 256


class SwapPlan:
    """Copies between guarded ranges, in descriptor order, with their expected outcome.

    Vectorized construction: :meth:`add_many` takes offset and size tensors for one (src, dst) pair.
    """

    def __init__(self) -> None:
        self._groups: list[tuple[GuardedBytes, torch.Tensor, GuardedBytes, torch.Tensor, torch.Tensor]] = []

    def add_many(
        self,
        src: GuardedBytes,
        src_offsets: torch.Tensor,
        dst: GuardedBytes,
        dst_offsets: torch.Tensor,
        sizes: torch.Tensor,
    ) -> None:
        """Append copies ``src[src_offsets[i]:+sizes[i]] -> dst[dst_offsets[i]:+sizes[i]]``."""
        src_offsets, dst_offsets, sizes = (
            torch.as_tensor(t, dtype=torch.int64).reshape(-1) for t in (src_offsets, dst_offsets, sizes)
        )
        if not (src_offsets.numel() == dst_offsets.numel() == sizes.numel()):
            raise ValueError("offsets and sizes must have equal lengths")
        if sizes.numel() and (
            int((src_offsets + sizes).max()) > src.size or int((dst_offsets + sizes).max()) > dst.size
        ):
            raise ValueError("a planned copy runs outside its guarded range (suite bug)")
        self._groups.append((src, src_offsets, dst, dst_offsets, sizes))

    @property
    def count(self) -> int:
        """Number of descriptors."""
        return sum(int(g[4].numel()) for g in self._groups)

    def descriptors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(src, dst, sizes)``: 1-D int64 CPU tensors of addresses and byte counts, in plan order."""
        if not self._groups:
            empty = torch.empty(0, dtype=torch.int64)
            return empty, empty.clone(), empty.clone()
        src = torch.cat([g[1] + g[0].address for g in self._groups])
        dst = torch.cat([g[3] + g[2].address for g in self._groups])
        sizes = torch.cat([g[4] for g in self._groups])
        return src, dst, sizes

    def arenas(self) -> list[GuardedBytes]:
        """Every guarded range the plan touches, each once."""
        seen: dict[int, GuardedBytes] = {}
        for src, _, dst, _, _ in self._groups:
            seen.setdefault(id(src), src)
            seen.setdefault(id(dst), dst)
        return list(seen.values())

    def snapshot(self) -> dict[int, torch.Tensor]:
        """CPU copies of every touched range, keyed by ``id(range)``."""
        return {id(a): a.read() for a in self.arenas()}

    def expected(self, before: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """The image of every touched range after the plan's copies, computed from ``before``."""
        after = {key: image.clone() for key, image in before.items()}
        for src, s_off, dst, d_off, sizes in self._groups:
            source, target = before[id(src)], after[id(dst)]
            total = int(sizes.sum())
            if total == 0:
                continue
            if total <= _BYTE_INDEX_LIMIT and sizes.numel() > _LOOP_COUNT:
                starts = torch.cumsum(sizes, 0) - sizes
                within = torch.arange(total, dtype=torch.int64) - torch.repeat_interleave(starts, sizes)
                target[torch.repeat_interleave(d_off, sizes) + within] = source[
                    torch.repeat_interleave(s_off, sizes) + within
                ]
            else:
                for so, do, n in zip(s_off.tolist(), d_off.tolist(), sizes.tolist(), strict=True):
                    target[do : do + n] = source[so : so + n]
        return after

    def _ranges_into(self, arena: GuardedBytes) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        index = 0
        for _, _, dst, d_off, sizes in self._groups:
            if dst is arena and d_off.numel() <= 100_000:
                out.extend(
                    (index + i, o, s) for i, (o, s) in enumerate(zip(d_off.tolist(), sizes.tolist(), strict=True))
                )
            index += int(sizes.numel())
        return out

    def assert_matches(self, expected: dict[int, torch.Tensor]) -> None:
        """Every touched range equals its expected image, byte for byte, and its canaries are intact."""
        for arena in self.arenas():
            actual = arena.read()
            want = expected[id(arena)]
            if not torch.equal(actual, want):
                raise AssertionError(describe_mismatch(actual, want, arena.label, self._ranges_into(arena)))
            arena.assert_canaries_intact()

    def assert_unchanged(self, before: dict[int, torch.Tensor]) -> None:
        """Nothing was copied: every touched range still equals ``before``, canaries intact."""
        for arena in self.arenas():
            actual = arena.read()
            if not torch.equal(actual, before[id(arena)]):
                raise AssertionError(
                    "a rejected batch must copy nothing, but "
                    + describe_mismatch(actual, before[id(arena)], arena.label, self._ranges_into(arena))
                )
            arena.assert_canaries_intact()
