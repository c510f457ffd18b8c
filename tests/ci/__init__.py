"""CI tooling (``ci/``: the job list, the hardware-matrix workflow, the report merge) and the README's commands,
which CI runs verbatim."""
