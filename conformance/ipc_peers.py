"""The processes of the IPC event tests: each is spawned, builds the backend under test from its recipe,
and plays one role (event owner, importer, pool producer or consumer) driven by messages.

Invariant: a peer never hangs its parent: every error is sent back as a message with its traceback,
every wait for another process is bounded, and the parent (:class:`Peer`) kills a peer that does not
answer in time and says which peer and what it was waiting for.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch

from hisparse_hal.errors import EventTimeoutError, HalError, UnsupportedCapabilityError
from hisparse_hal.python_child import die_with_parent

from .recipe import BackendRecipe

__all__ = ["Peer", "issue_pending_record", "delay_device", "pool_pattern", "PEER_TIMEOUT_S"]

#: Longest a peer or the parent waits for the other side's next message.
PEER_TIMEOUT_S = 60.0
#: Device cycles of the delay that keeps a record pending on a GPU (about a second or two).
DELAY_CYCLES = 2_000_000_000


def issue_pending_record(backend: Any, event: Any) -> str:
    """Leave a record pending on ``event``: ``"never"`` completes, ``"delayed"`` completes after a while.

    The suite's hook: an event that provides ``_issue_pending()`` (the CPU device, whose host work is
    synchronous) issues a record that never completes, as if its work were still in flight; otherwise
    the device runs a busy kernel (``torch.<device>._sleep``) before the record.

    Raises:
        UnsupportedCapabilityError: neither is available on this backend.
    """
    hook = getattr(event, "_issue_pending", None)
    if callable(hook):
        hook()
        return "never"
    if delay_device(backend):
        event.record()
        return "delayed"
    raise UnsupportedCapabilityError(
        f"cannot leave a record pending on {backend.name!r}: its events have no _issue_pending() and "
        f"torch.{backend.device.type} has no _sleep()"
    )


#: Seconds the CPU device's delayed swap lands after it is issued (CpuBackend.delay_next_swap).
HOST_DELAY_S = 1.0


def delay_device(backend: Any) -> bool:
    """Make the next swap land well after ``record()`` returns: a busy kernel of a second or two on the
    device's current stream, where torch has one (``torch.<device>._sleep``), or the backend's own
    ``delay_next_swap(seconds)`` hook (the CPU device, whose host work is otherwise synchronous).
    False when neither exists."""
    hook = getattr(backend, "delay_next_swap", None)
    if callable(hook):
        hook(HOST_DELAY_S)
        return True
    sleep = getattr(getattr(torch, backend.device.type, None), "_sleep", None)
    if backend.device.type == "cpu" or not callable(sleep):
        return False
    sleep(DELAY_CYCLES)
    return True


def pool_pattern(size: int, cycle: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``size`` bytes a producer writes in ``cycle`` (different every cycle)."""
    return ((torch.arange(size, dtype=torch.int32, device=device) % 251 + cycle * 7 + 1) % 256).to(torch.uint8)


def _recv(conn: Connection, what: str) -> Any:
    if not conn.poll(PEER_TIMEOUT_S):
        raise TimeoutError(f"no {what} within {PEER_TIMEOUT_S:.0f} s")
    return conn.recv()


def _outcome(call: Callable[[], object]) -> dict[str, Any]:
    start = time.monotonic()
    try:
        call()
        raised = None
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which judges it
        raised = exc
    out: dict[str, Any] = {"elapsed": time.monotonic() - start, "raised": None}
    if raised is not None:
        out.update(
            raised=type(raised).__name__,
            hal_error=isinstance(raised, HalError),
            timeout_error=isinstance(raised, EventTimeoutError),
            message=str(raised),
        )
    return out


# ------------------------------------------------------------------------------------------ roles
def _event_owner(backend: Any, conn: Connection) -> None:
    event = backend.create_ipc_event()
    conn.send({"kind": "handle", "handle": backend.export_event(event)})
    while True:
        msg = _recv(conn, "command")
        if msg["kind"] == "record":
            event.record()
            conn.send({"kind": "recorded"})
        elif msg["kind"] == "pending":
            conn.send({"kind": "pending", "mode": issue_pending_record(backend, event)})
        elif msg["kind"] == "exit":
            conn.send({"kind": "bye"})
            return


def _wait_then_synchronize(event: Any) -> None:
    event.wait()
    event.synchronize()


def _query_into(event: Any, seen: dict[str, bool]) -> None:
    seen["query"] = bool(event.query())


def _event_importer(backend: Any, conn: Connection) -> None:
    event: Any = None  # the imported event, once the parent sends "import"
    own: Any = None  # this process's own event, once the parent asks for "export"
    while True:
        msg = _recv(conn, "command")
        if msg["kind"] == "import":
            event = backend.import_event(backend.device, msg["handle"])
            conn.send({"kind": "imported", "query": bool(event.query())})
        elif msg["kind"] == "wait":
            out = _outcome(functools.partial(_wait_then_synchronize, event))
            seen: dict[str, bool] = {}
            _outcome(functools.partial(_query_into, event, seen))
            out["query_after"] = seen.get("query")
            conn.send({"kind": "waited", **out})
        elif msg["kind"] == "export":
            own = backend.create_ipc_event()
            conn.send({"kind": "handle", "handle": backend.export_event(own)})
        elif msg["kind"] == "record_own":
            own.record()
            conn.send({"kind": "recorded"})
        elif msg["kind"] == "exit":
            conn.send({"kind": "bye"})
            return


def _pool_producer(
    backend: Any, conn: Connection, peer: Connection, pool: torch.Tensor, cycles: int, size: int, delay_first: bool
) -> None:
    from .arenas import device_caches

    backend.pin_tensor(pool)
    try:
        with device_caches(backend, 1, size, "producer cache") as (cache,):
            event = backend.create_ipc_event()
            peer.send(("handle", backend.export_event(event)))
            if _recv(peer, "consumer ready") != ("ready",):
                raise RuntimeError("consumer did not say ready")
            block = 512 if size % 512 == 0 else size
            count = size // block
            src = cache.address + torch.arange(count) * block
            dst = pool.data_ptr() + torch.arange(count).flip(0) * block  # blocks land reversed
            sizes = torch.full((count,), block)
            for cycle in range(cycles):
                pattern = pool_pattern(size, cycle, backend.device)
                cache.inner[:size].copy_(pattern.view(count, block).flip(0).reshape(-1))
                if delay_first and cycle == 0:
                    delay_device(backend)  # the copy below then lands well after record() returns
                backend.swap_blocks_batch(src, dst, sizes)
                event.record()
                peer.send(("recorded", cycle))
                ack = _recv(peer, f"consumer ack of cycle {cycle}")
                if ack != ("ack", cycle):
                    raise RuntimeError(f"consumer answered {ack!r} to cycle {cycle}")
            conn.send({"kind": "done", "cycles": cycles})
            _recv(conn, "exit")
            del event
    finally:
        backend.unpin_tensor(pool)


def _pool_consumer(
    backend: Any, conn: Connection, peer: Connection, pool: torch.Tensor, cycles: int, size: int
) -> None:
    kind, handle = _recv(peer, "producer handle")
    event = backend.import_event(backend.device, handle)
    peer.send(("ready",))
    failure = None
    done = 0
    for cycle in range(cycles):
        msg = _recv(peer, f"producer record of cycle {cycle}")
        if msg != ("recorded", cycle):
            failure = f"cycle {cycle}: producer sent {msg!r}"
            break
        event.wait()
        event.synchronize()
        got = pool[:size]
        want = pool_pattern(size, cycle)
        if not torch.equal(got, want):
            bad = int((got != want).nonzero()[0])
            failure = (
                f"cycle {cycle}: after wait() and synchronize() the pool differs from what the producer wrote "
                f"before record() in {int((got != want).sum())} of {size} bytes (first at {bad})"
            )
            break
        done += 1
        peer.send(("ack", cycle))
    conn.send({"kind": "result", "cycles_ok": done, "failure": failure})
    _recv(conn, "exit")


ROLES: dict[str, Callable[..., None]] = {
    "event_owner": _event_owner,
    "event_importer": _event_importer,
    "pool_producer": _pool_producer,
    "pool_consumer": _pool_consumer,
}


def peer_main(recipe: BackendRecipe, role: str, conn: Connection, params: dict[str, Any], env: dict[str, str],
              parent_pid: int) -> None:
    """Entry point of a spawned peer: die with ``parent_pid`` (the test process), build the backend, play
    ``role``, report any error."""
    die_with_parent(parent_pid)
    os.environ.update(env)
    try:
        backend = recipe.build()
        ROLES[role](backend, conn, **params)
    except BaseException as exc:  # noqa: BLE001 - sent to the parent with the traceback
        try:
            conn.send({"kind": "error", "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        except Exception:  # noqa: BLE001 - the parent may be gone
            pass
    finally:
        conn.close()


class Peer:
    """The parent's handle on one spawned peer: bounded exchanges, and a kill that always happens."""

    def __init__(self, recipe: BackendRecipe, role: str, *, params: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, name: str | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name or role
        self.conn, child = context.Pipe()
        self.process = context.Process(
            target=peer_main,
            args=(recipe, role, child, params or {}, env or {}, os.getpid()),
            name=f"hisparse-conformance-{self.name}",
            daemon=True,
        )
        self.process.start()
        child.close()

    def send(self, kind: str, **fields: Any) -> None:
        """Send a command."""
        self.conn.send({"kind": kind, **fields})

    def expect(self, kind: str, timeout: float = PEER_TIMEOUT_S) -> dict[str, Any]:
        """The peer's next message, which must be of ``kind``.

        Raises:
            AssertionError: the peer failed (with its traceback), exited, answered something else, or
                said nothing within ``timeout`` seconds (it is then killed).
        """
        try:
            ready = self.conn.poll(timeout)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            raise AssertionError(f"peer {self.name} sent no {kind!r} within {timeout:.0f} s; it was killed")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(5)
            raise AssertionError(
                f"peer {self.name} exited (code {self.process.exitcode}) before sending {kind!r}"
            ) from None
        if msg.get("kind") == "error":
            raise AssertionError(f"peer {self.name} failed: {msg['error']}\n--- peer traceback ---\n{msg['traceback']}")
        if msg.get("kind") != kind:
            raise AssertionError(f"peer {self.name} sent {msg!r}, expected {kind!r}")
        return msg

    def kill(self) -> None:
        """Kill the peer at once (SIGKILL) and reap it."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)

    def stop(self) -> None:
        """Ask the peer to exit, then kill it if it has not within a few seconds."""
        if self.process.is_alive():
            try:
                self.send("exit")
            except (OSError, ValueError):
                pass
            self.process.join(10)
        self.kill()
        self.conn.close()
