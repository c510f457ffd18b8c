"""Typed errors raised by hisparse-hal.

Every error says what was wrong, with which value, and what to do. Each class also derives from the
built-in exception an engine would naturally catch (``RuntimeError``, ``ValueError``, ...), so callers
written against plain Python exceptions keep working.
"""

from __future__ import annotations

__all__ = [
    "HalError",
    "BackendUnavailableError",
    "InvalidArgumentError",
    "InvalidDescriptorError",
    "ScalarRangeError",
    "ResourceExhaustedError",
    "CacheOpArityError",
    "UnionOverflowError",
    "UnpinError",
    "UnknownTableError",
    "UnsupportedCapabilityError",
    "CaptureMisuseError",
    "DeviceRuntimeError",
    "EventTimeoutError",
    "PeerLostError",
]


class HalError(Exception):
    """Base class of every error hisparse-hal raises on purpose."""


class BackendUnavailableError(HalError, RuntimeError):
    """No usable backend: an unknown or unavailable name, a tie, or a failed vendor probe.

    ``table`` holds the rendered probe table when the error came from selection.
    """

    def __init__(self, message: str, table: str | None = None) -> None:
        super().__init__(message if table is None else f"{message}\n\n{table}")
        self.table = table


class InvalidArgumentError(HalError, ValueError):
    """An argument has the wrong type, dtype, device, shape or value."""


class InvalidDescriptorError(InvalidArgumentError):
    """A swap descriptor batch was rejected before anything was copied.

    ``index`` is the first bad descriptor (or None when the batch as a whole is malformed).
    """

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class ScalarRangeError(InvalidArgumentError):
    """An integer argument (a cache op's scalar, say) is a Python int outside what the arithmetic that uses it
    can hold. ``argument`` names it, ``value`` is what was passed, ``low``/``high`` the inclusive bounds."""

    def __init__(self, argument: str, value: int, low: int, high: int, why: str) -> None:
        super().__init__(f"{argument} is {value}; expected an int in [{low}, {high}]{why}")
        self.argument = argument
        self.value = value
        self.low = low
        self.high = high


class CacheOpArityError(InvalidArgumentError, TypeError):
    """A cache op was called with a number of arguments (or a keyword) its vLLM 0.34.0 schema does not take;
    nothing ran. Also a ``TypeError``, what Python raises for a wrong call, so callers catching that keep working.

    ``op`` is the op's name, ``given`` the count of arguments passed, ``expected`` the counts it takes
    (``(required, total)``).
    """

    def __init__(self, op: str, given: int, expected: tuple[int, int], detail: str = "") -> None:
        required, total = expected
        takes = f"{total}" if required == total else f"{required} to {total}"
        extra = f" ({detail})" if detail else ""
        super().__init__(f"{op} takes {takes} arguments, as vLLM 0.34.0's schema, but was given {given}{extra}; "
                         "nothing was run")
        self.op = op
        self.given = given
        self.expected = expected


class UnpinError(InvalidArgumentError, RuntimeError):
    """``unpin_tensor`` was given something this backend cannot release: not a host tensor, or one it did
    not pin. Also a ``RuntimeError``, the only failure vLLM 0.34.0's ``release_pinned_state`` catches
    (``vllm/v1/hisparse/runtime.py:374``); an ``InvalidArgumentError`` for callers of this package."""


class UnionOverflowError(InvalidArgumentError):
    """One request's contiguous rows select more distinct host rows than ``max_union_rows`` in one
    ``resolve_residency`` call. vLLM's CUDA kernel traps (``hisparse_kernels.cu:563-571``); we raise before
    anything is written.

    ``state_row`` and ``request`` identify the run (its state row and batch request row), ``union_rows`` is
    its count of distinct host rows and ``max_union_rows`` the bound it passed.
    """

    def __init__(self, state_row: int, request: int, union_rows: int, max_union_rows: int) -> None:
        super().__init__(
            f"request {request} (state row {state_row}) selects {union_rows} distinct host rows in one call, "
            f"more than max_union_rows = {max_union_rows}; nothing was written. Raise max_union_rows "
            "(vLLM: max_decode_query_len x index_topk) or split the request's rows"
        )
        self.state_row = state_row
        self.request = request
        self.union_rows = union_rows
        self.max_union_rows = max_union_rows


class UnknownTableError(InvalidArgumentError):
    """``invalidate_written_slots`` got a table address that no registered ``device_global_indices`` table
    of the expected shape has (``address``); nothing was written. Tables are registered by
    ``create_cache_ops(runtime)`` or :func:`hisparse_hal.cache_ops.tables.register_table`."""

    def __init__(self, address: int, index: int, detail: str) -> None:
        super().__init__(
            f"device_global_indices_ptrs[{index}] = {address:#x} {detail}; nothing was written. Register the "
            "table first (backend.create_cache_ops(runtime) or cache_ops.tables.register_table(tensor))"
        )
        self.address = address
        self.index = index


class UnsupportedCapabilityError(HalError, NotImplementedError):
    """The backend does not implement a member, or lacks the capability an operation needs."""


class CaptureMisuseError(HalError, RuntimeError):
    """An operation that cannot run inside a graph capture was called while capturing,
    or ``capture()``/``replay()`` was used out of order. The capture itself stays usable."""


class DeviceRuntimeError(HalError, RuntimeError):
    """A vendor runtime call returned an error code.

    ``code`` is the numeric status, ``error_name`` its symbolic name (``CUDA_ERROR_INVALID_VALUE``,
    ``hipErrorInvalidValue``), ``call`` the runtime function and ``index`` the failing descriptor of a
    batch when the runtime reports one.
    """

    def __init__(
        self,
        call: str,
        code: int,
        error_name: str,
        detail: str = "",
        index: int | None = None,
    ) -> None:
        where = f" at descriptor {index}" if index is not None else ""
        extra = f": {detail}" if detail else ""
        super().__init__(f"{call} failed with {error_name} ({code}){where}{extra}")
        self.call = call
        self.code = code
        self.error_name = error_name
        self.detail = detail
        self.index = index


class EventTimeoutError(HalError, TimeoutError):
    """A wait on an interprocess event did not complete within its bound."""


class ResourceExhaustedError(HalError, OSError):
    """The system refused a resource (file descriptors, space in the shared-memory directory) that an
    operation needed; nothing was left half-made. ``errno`` is the system's code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)


class PeerLostError(EventTimeoutError):
    """The process on the other side of an interprocess event or a shared pool exited or let go of it,
    so what was being waited for can never happen.

    A subclass of ``EventTimeoutError``: a wait on a lost peer is a wait that cannot complete.
    ``pid`` is the lost process's id when known, ``rank`` its rank in a multi-process run when known.
    """

    def __init__(self, message: str, *, pid: int | None = None, rank: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid
        self.rank = rank
