"""An opt-in, test-only delay for the CPU device: a swap that lands on a background thread a little after
``record()`` returns, as a GPU copy does, so that an IPC ``wait()`` which does not wait is caught.

Off unless armed with :meth:`DelayedWork.delay_next`; the conformance IPC peer and the CPU IPC tests arm it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["DelayedWork"]

log = logging.getLogger(__name__)


class DelayedWork:
    """The host work of one CPU backend that an armed delay left in flight, in issue order.

    Work runs on one background thread per item, each after the previous one; :meth:`after` queues an
    action (an IPC record's completion) behind everything in flight, and :meth:`drain` waits for it all.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tail: threading.Thread | None = None
        self._armed_s = 0.0
        self._failure: BaseException | None = None

    def delay_next(self, seconds: float) -> None:
        """Run the next piece of work given to :meth:`run` ``seconds`` later, on a background thread."""
        with self._lock:
            self._armed_s = float(seconds)

    def run(self, work: Callable[[], None]) -> None:
        """Run ``work`` now, or (when armed, or when earlier work is still in flight) on a background
        thread after that work and the armed delay; the delay applies once."""
        with self._lock:
            delay, self._armed_s = self._armed_s, 0.0
            in_flight = self._tail is not None and self._tail.is_alive()
        if not delay and not in_flight:
            work()
            return
        self._queue(work, delay)

    def after(self, action: Callable[[], None]) -> None:
        """Run ``action`` once all work in flight has finished (at once when none is)."""
        with self._lock:
            in_flight = self._tail is not None and self._tail.is_alive()
        if in_flight:
            self._queue(action, 0.0)
        else:
            action()

    def drain(self) -> None:
        """Wait for all work in flight; re-raise the first failure of a delayed piece of work."""
        with self._lock:
            tail = self._tail
        if tail is not None:
            tail.join()
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _queue(self, work: Callable[[], None], delay: float) -> None:
        with self._lock:
            previous = self._tail

            def body() -> None:
                if previous is not None:
                    previous.join()
                time.sleep(delay)
                try:
                    work()
                except BaseException as exc:  # noqa: BLE001 - kept for drain(), as a stream keeps an error
                    log.error("delayed CPU work failed: %s", exc)
                    with self._lock:
                        self._failure = self._failure or exc

            self._tail = threading.Thread(target=body, name="hisparse-hal-cpu-delayed-work", daemon=True)
            self._tail.start()
