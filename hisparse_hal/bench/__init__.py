"""Every benchmark behind ``hisparse-hal bench``: swaps and gathers, swap submission cost, the cache ops.

Each compares, in one run, our path against the plain alternative and a plain copy of the same bytes. The
modules share one timing (:mod:`.timing`) and one table and JSON writer (:mod:`.table`); :mod:`.command`
holds the CLI options and dispatch. This package imports none of its modules on import.
"""
