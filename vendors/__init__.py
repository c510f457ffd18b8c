"""Built-in backends, one folder each: ``cpu`` (reference device), ``cuda`` and ``rocm``.

Each folder holds ``spec.py`` (a cheap probe and the backend's qualified name), the backend class, its
runtime binding and its conformance expectations. Importing this package imports no vendor library.
"""

# The folder sits at the checkout's top level and is linked into the package (hisparse_hal/vendors ->
# ../vendors); imported under any other name it would be a second copy of every module in it.
if __name__ != "hisparse_hal.vendors":
    raise ImportError(f"{__name__!r} is hisparse-hal's vendors folder; import it as 'hisparse_hal.vendors'")

