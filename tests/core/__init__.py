"""Tests of the core modules (hisparse_hal/*.py), one test_<module>.py per module."""
