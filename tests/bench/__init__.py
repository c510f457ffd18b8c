"""The benchmarks (``hisparse_hal/bench/``): behaviour and output, never speed."""
