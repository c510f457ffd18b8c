"""Bridges from hisparse-hal to inference engines; each module imports its engine lazily, never at package import."""
