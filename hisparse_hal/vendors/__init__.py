"""Built-in backends, one folder each: ``cpu`` (reference device), ``cuda`` and ``rocm``.

Each folder holds ``spec.py`` (a cheap probe and the backend's qualified name), the backend class, its
runtime binding and its conformance expectations. Importing this package imports no vendor library.
"""
