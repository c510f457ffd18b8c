"""Tests of vendors/cuda/, test_<module>.py per module (spec, runtime, capabilities, backend), on simulated libcuda."""
