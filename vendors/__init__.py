"""Built-in backends, one folder each: ``cpu`` (reference device), ``cuda`` and ``rocm``; ``gpu`` holds what
``cuda`` and ``rocm`` share (both reach the device through torch's device module, ``gpu/device_module.py``).

Every registered vendor folder has the same file set, checked by ``tests/vendors/test_file_set.py``:

- ``spec.py``: the registry entry (``SPEC``), a cheap probe that creates no device context;
- ``capabilities.py``: ``plan_capabilities``, every version quirk decided in one pure function;
- ``runtime.py``: the binding to the vendor's C runtime, the only module that calls into it
  (``cuda``: libcuda, ``CudaDriver``; ``rocm``: libamdhip64, ``HipRuntime``; ``cpu``: libc ``mlock``,
  ``munlock`` and ``memmove``);
- ``backend.py``: the backend class; ``expectations.toml``: the conformance suite's expected failures.

Anything else in a folder is that vendor's own. Importing this package imports no vendor library.
"""

# The folder sits at the checkout's top level and is mapped into the package by the build (pyproject's
# package-dir); imported under any other name it would be a second copy of every module in it.
if __name__ != "hisparse_hal.vendors":
    raise ImportError(f"{__name__!r} is hisparse-hal's vendors folder; import it as 'hisparse_hal.vendors'")

