"""An engine on one machine: the tensor-parallel offload scenario (vLLM #56629's shared host pool).

Rank 0 is the only writer of one host pool shared by every local rank; per step it spills KV blocks
into the pool and signals, peers read the step back and verify every byte, and rank 0 never reuses a
slot before every peer finished reading it. Any backend runs it; the synchronization path is chosen by
capability.
"""

from .config import FaultPlan, ScenarioConfig, SyncChoice, choose_sync
from .driver import RankOutcome, ScenarioResult, run_scenario

__all__ = ["FaultPlan", "ScenarioConfig", "SyncChoice", "choose_sync", "RankOutcome", "ScenarioResult", "run_scenario"]
