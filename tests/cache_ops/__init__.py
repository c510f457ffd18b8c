"""Tests of hisparse_hal/cache_ops/: one file per module (oracle, torch_impl, triton_impl, library, selection, ...)."""
