"""What the CUDA and ROCm backends share, written once: both reach their GPU through torch's device module for
the ``"cuda"`` device type (torch's HIP build answers to it too) and ``torch.accelerator``, so streams, graph
capture and IPC events are the same code.

- ``device_module``: the one place torch is asked for the device (``torch.get_device_module``,
  ``torch.accelerator``); simulators replace it, not torch.
- ``runtime``: the ``CopyRuntime`` protocol each vendor's ``runtime.py`` binding implements, and the
  descriptor handling both batch calls need.
- ``backend``: ``TorchGpuBackend``, the per-swap copy path (batch or per-copy loop), chunking, pinning, gathers.
- ``events``: the IPC event handle codec and ``GpuIpcEvent``. ``graph``: ``GpuCapturedGraph``.
- ``host_aliases``: pinned host address -> device address. ``gather_check``: the Triton id check of gathers.

A vendor folder holds only what differs: its probe, binding, capability plan and backend subclass.
Importing this package imports none of its modules.
"""
