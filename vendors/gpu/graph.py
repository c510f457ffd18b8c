"""A captured GPU graph: the ``torch.cuda.CUDAGraph`` that :meth:`TorchGpuBackend.capture` yields, replayable
only once the capture has ended."""

from __future__ import annotations

import torch

from hisparse_hal.errors import CaptureMisuseError

__all__ = ["GpuCapturedGraph"]


class GpuCapturedGraph:
    """A ``torch.cuda.CUDAGraph`` captured by :meth:`TorchGpuBackend.capture`."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph
        self.complete = False

    def replay(self) -> None:
        """Run the captured work on the current stream.

        Raises:
            CaptureMisuseError: the capture has not ended (replay inside the ``with`` block) or failed.
        """
        if not self.complete:
            raise CaptureMisuseError(
                "replay() called before the capture ended; leave the capture() block first"
            )
        self.graph.replay()

