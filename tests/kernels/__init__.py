"""Tests of hisparse_hal/kernels/: the offline compile report (needs triton) and the generated docs/kernels.md."""
