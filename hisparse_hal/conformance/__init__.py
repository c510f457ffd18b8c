"""The shared conformance suite every backend must pass: a pytest plugin (``-p
hisparse_hal.conformance.plugin``), the tests it runs, and the ``hisparse-hal conformance`` runner.

Nothing here registers itself with pytest automatically; the suite only runs when asked for.
"""

__all__ = ["SUITE_VERSION"]

#: Version of the suite's tests and report format; bump when tests are added or their meaning changes.
SUITE_VERSION = "1.0"
