"""Tests of the conformance harness (runner, plugin, report, junit, recipe, expectations) and its self-test."""
