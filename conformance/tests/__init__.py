"""Conformance tests, shipped inside the package and run through ``hisparse-hal conformance``."""
