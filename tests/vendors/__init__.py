"""Tests of vendors/, a folder per vendor with test_<module>.py per module; test_file_set checks the file set."""
