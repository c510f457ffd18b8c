"""The core room (``hisparse_hal/*.py``): contract checks, regions, host registration, KV-cache views, gathers, the
registry and probing, child processes, the package's layout and import graph."""
