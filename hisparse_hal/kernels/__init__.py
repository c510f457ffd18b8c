"""``hisparse-hal kernels``: the offline tools for the Triton cache-ops kernels (compile for GPU targets, report).

- ``specs``: the launches compiled (the ops' own launch plans at DeepSeek-V3.2 shapes).
- ``report``: the offline compile per target and its facts (shared memory, registers, spills, code size).
- ``page``: docs/kernels.md's generated tables, rendered from a ``--json`` document.
- ``device_check``: on a GPU machine, triton's runtime compile set against the offline one.
- ``command``: the command itself. Nothing here runs at serving time; the ops are :mod:`hisparse_hal.cache_ops`.
"""
