"""The shared conformance suite every backend must pass: a pytest plugin (``-p
hisparse_hal.conformance.plugin``), the tests it runs, and the ``hisparse-hal conformance`` runner.

Nothing here registers itself with pytest automatically; the suite only runs when asked for.
"""

# The folder sits at the checkout's top level and is mapped into the package by the build (pyproject's
# package-dir); imported under any other name it would be a second copy of every module in it.
if __name__ != "hisparse_hal.conformance":
    raise ImportError(f"{__name__!r} is hisparse-hal's conformance folder; import it as 'hisparse_hal.conformance'")


__all__ = ["SUITE_VERSION"]

#: Version of the suite's tests and report format; bump when tests are added or their meaning changes.
SUITE_VERSION = "1.0"
