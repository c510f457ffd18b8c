"""Tests of vendors/gpu/ (shared by CUDA and ROCm), test_<module>.py per module; test_gather_on_device: gathers."""
