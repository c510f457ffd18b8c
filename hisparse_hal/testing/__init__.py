"""Test doubles and generators that vendors can reuse in their own CI, shipped with the package.

- ``sim_cuda_driver``: a SIMULATED libcuda (C function pointers, real host bytes); not NVIDIA software.
- ``sim_hip_runtime``: a SIMULATED libamdhip64 that behaves as each documented HIP release does; not AMD software.
- ``sim_device_module``: a SIMULATED torch device module for the GPU backends over those libraries (current stream,
  capture state, synchronisation, IPC events as attributes and hooks), so no ``torch.cuda`` is needed.
- ``broken_backends``: the CPU reference device with one planted bug each; the conformance suite must fail each
  in its area (``hisparse-hal conformance --factory hisparse_hal.testing.broken_backends:<Class>``).
- ``bad_input_worlds`` and ``bad_input_strategies``: guarded memory worlds and Hypothesis strategies for input
  every backend must refuse (the strategies need ``hypothesis``, from the ``[test]`` extra).
- ``sequences``: generated multi-step decode sequences of the vLLM 0.34.0 cache ops and a runner recording every
  output and state tensor, for differential tests (the suite's cache-ops tier, the kernel peer, the unit tests).
- ``host_sync_guard``: fails on any host read of a tensor value, which a CUDA/HIP graph capture cannot do.

None of this is imported by ``import hisparse_hal``, and nothing in it proves anything about a GPU.
"""
