"""Tests of vendors/rocm/, test_<module>.py per module on the simulated HIP runtime; test_conformance_sim: the suite."""
