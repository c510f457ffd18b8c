"""The shared conformance suite every backend must pass (filled by the conformance work)."""
