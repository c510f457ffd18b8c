"""The CPU reference device: the whole contract on host memory, and the conformance suite's oracle."""
