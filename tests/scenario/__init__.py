"""The tensor-parallel scenario (``hisparse_hal/scenario/``), one file per module."""
