"""Engine integrations (``hisparse_hal/integrations/``); with_vllm/ runs against the real vLLM 0.34.0 (ci/vllm-
tests.sh)."""
