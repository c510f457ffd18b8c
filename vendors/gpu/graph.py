"""A captured GPU graph: the device module's graph (``torch.cuda.CUDAGraph`` on CUDA and HIP) that
:meth:`TorchGpuBackend.capture` yields, replayable only once the capture has ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hisparse_hal.errors import CaptureMisuseError
from hisparse_hal.regions import Region

__all__ = ["GpuCapturedGraph"]


class GpuCapturedGraph:
    """A device-module graph (``torch.cuda.CUDAGraph`` on CUDA and HIP) captured by :meth:`TorchGpuBackend.capture`.

    ``regions`` collects the regions the captured swaps named; ``before_replay`` (the backend's check that
    they are all still registered) runs before every replay, so a graph never copies into memory released
    since the capture.
    """

    def __init__(
        self, graph: Any, before_replay: Callable[[GpuCapturedGraph], None] | None = None
    ) -> None:
        self.graph = graph
        self.complete = False
        self.regions: set[Region] = set()
        self.before_replay = before_replay

    def replay(self) -> None:
        """Run the captured work on the current stream.

        Raises:
            CaptureMisuseError: the capture has not ended (replay inside the ``with`` block) or failed.
            InvalidDescriptorError: a captured swap names a region released since the capture (nothing ran).
        """
        if not self.complete:
            raise CaptureMisuseError(
                "replay() called before the capture ended; leave the capture() block first"
            )
        if self.before_replay is not None:
            self.before_replay(self)
        self.graph.replay()

