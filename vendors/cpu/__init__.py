"""The CPU reference device: the whole contract on host memory, and the conformance suite's oracle.

``spec`` (always-available probe), ``capabilities`` (``plan_capabilities``), ``runtime`` (the libc binding:
``mlock``/``munlock`` page locking, ``memmove``), ``backend`` (``CpuBackend``), and what only this device
needs: ``byte_copy`` (vectorized swaps), ``graph`` (capture and replay), ``ipc_event`` (shared-memory IPC
events) and ``delayed_work`` (a test-only late swap).
"""

from .capabilities import plan_capabilities

__all__ = ["plan_capabilities"]
