"""Tests of the conformance harness (conformance/: runner, plugin, report, junit, recipe, expectations) and its self-test."""
