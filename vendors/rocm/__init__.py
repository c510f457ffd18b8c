"""ROCM backend (see spec.py for its probe)."""
