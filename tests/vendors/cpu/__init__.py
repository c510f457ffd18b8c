"""Tests of vendors/cpu/, test_<module>.py per module; test_gather and test_kv_views test behaviours of backend.py."""
