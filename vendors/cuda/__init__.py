"""CUDA backend (see spec.py for its probe)."""
