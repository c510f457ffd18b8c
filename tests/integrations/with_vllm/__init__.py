"""Tests against the real vLLM 0.34.0 package; they skip without it (ci/vllm-tests.sh builds a venv with it)."""
