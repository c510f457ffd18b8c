"""Which hisparse-hal members each vLLM test called: vLLM's ``HiSparseBackend`` members on our class and the four
cache ops, wrapped at class level for the session, counted per test id (see ``summary_line``).

Construction alone is not a call; a member a vLLM test monkeypatched away never reaches the wrapper.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from typing import Any

#: Member -> the group the summary line counts it under (None: counted only in the total).
GROUPS: dict[str, str | None] = {
    "pin_tensor": "pinning",
    "unpin_tensor": "pinning",
    "swap_blocks_batch": "swaps",
    "gather_resident_rows": "swaps",
    "hisparse_resolve_residency": "cache ops",
    "hisparse_gather_compact": "cache ops",
    "hisparse_gather_plan": "cache ops",
    "hisparse_invalidate_written_slots": "cache ops",
    "create_ipc_event": "events",
    "export_event": "events",
    "import_event": "events",
    "check_available": None,
    "create_cache_ops": None,
    "validate_kv_cache_config": None,
    "prepare_kv_cache_views": None,
    "is_current_stream_capturing": None,
    "supports_shared_host_pool": None,
    "stats_dtype": None,
}
CACHE_OPS = ("hisparse_resolve_residency", "hisparse_gather_compact", "hisparse_gather_plan",
             "hisparse_invalidate_written_slots")


class MemberTrace:
    """Records, per test id, the hisparse-hal members called while that test ran (setup, call, teardown)."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.calls: dict[str, set[str]] = defaultdict(set)
        self.ran: list[str] = []

    def _record(self, name: str) -> None:
        if self.current is not None:
            self.calls[self.current].add(name)

    def _wrap_function(self, owner: type, name: str) -> None:
        original = inspect.getattr_static(owner, name)

        @functools.wraps(original)
        def traced(*args: Any, **kwargs: Any) -> Any:
            self._record(name)
            return original(*args, **kwargs)

        setattr(owner, name, traced)

    def _wrap_property(self, owner: type, name: str) -> None:
        original = inspect.getattr_static(owner, name)

        def getter(instance: Any) -> Any:
            self._record(name)
            return original.fget(instance)

        setattr(owner, name, property(getter, doc=original.__doc__))

    def install(self) -> None:
        """Wrap our vLLM adapter's members and the cache ops class for the rest of the process."""
        from hisparse_hal.cache_ops.bound import CacheOps
        from hisparse_hal.integrations.vllm_backend import HalHiSparseBackend

        for name in GROUPS:
            owner = CacheOps if name in CACHE_OPS else HalHiSparseBackend
            if isinstance(inspect.getattr_static(owner, name), property):
                self._wrap_property(owner, name)
            else:
                self._wrap_function(owner, name)

    def tests_in(self, group: str | None) -> int:
        """How many tests that ran called a member of ``group`` (None: any member)."""
        return sum(1 for test in self.ran
                   if any(group is None or GROUPS[name] == group for name in self.calls.get(test, ())))

    def summary_line(self) -> str:
        """The line CI prints and the README quotes."""
        groups = ", ".join(f"{group}: {self.tests_in(group)}" for group in ("pinning", "swaps", "cache ops", "events"))
        return f"{self.tests_in(None)} of {len(self.ran)} vLLM tests called a hisparse-hal member ({groups})"

    def member_counts(self) -> dict[str, int]:
        """Member -> how many tests that ran called it (members no test called are left out)."""
        counts: dict[str, int] = defaultdict(int)
        for test in self.ran:
            for name in self.calls.get(test, ()):
                counts[name] += 1
        return dict(sorted(counts.items()))
