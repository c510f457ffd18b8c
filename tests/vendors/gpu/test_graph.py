"""``GpuCapturedGraph`` (``vendors/gpu/graph.py``): replay only once the capture has ended."""

from __future__ import annotations

import pytest

from hisparse_hal.errors import CaptureMisuseError
from hisparse_hal.vendors.gpu.graph import GpuCapturedGraph


def test_replay_before_the_capture_ends_is_misuse() -> None:
    class Graph:
        replays = 0

        def replay(self) -> None:
            Graph.replays += 1

    captured = GpuCapturedGraph(Graph())
    with pytest.raises(CaptureMisuseError, match="replay\\(\\) called before the capture ended"):
        captured.replay()
    captured.complete = True
    captured.replay()
    assert Graph.replays == 1
