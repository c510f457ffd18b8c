"""Tests of ci/: the job list, the hardware-matrix workflow and the report merge."""
