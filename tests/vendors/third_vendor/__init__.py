"""A third vendor built only in the tests: the CPU device under a name the core has never heard of ("third"),
registered through a test-time dist-info's ``hisparse_hal.backends`` entry point, never through pyproject."""
