"""The command room: the ``hisparse-hal`` console script and its launcher, one error path and exit codes, argument
and environment checks, interrupts and process groups."""
