"""The Hugging Face Hub models vLLM 0.34.0's HiSparse tests name, as a local hub cache holding only each model's
``config.json`` (written here, small), so those tests run with ``HF_HUB_OFFLINE=1`` and no network.

Names: ``facebook/opt-125m`` (tests/v1/core/utils.py:60, tests/v1/kv_connector/unit/utils.py:122) and
``Qwen/Qwen3-0.6B`` (``ModelConfig``'s default model, vllm/config/model.py; used by tests/test_config.py's
``VllmConfig()`` calls and tests/v1/core/test_kv_cache_{planning,utils}.py). Only the fields vLLM's config code
reads are given; the shapes are the published models' (vLLM derives ``max_model_len`` from them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Repository id -> its config.json.
MODELS: dict[str, dict[str, Any]] = {
    "facebook/opt-125m": {
        "architectures": ["OPTForCausalLM"], "model_type": "opt", "activation_function": "relu",
        "do_layer_norm_before": True, "ffn_dim": 3072, "hidden_size": 768, "word_embed_proj_dim": 768,
        "max_position_embeddings": 2048, "num_attention_heads": 12, "num_hidden_layers": 12,
        "vocab_size": 50272, "bos_token_id": 2, "eos_token_id": 2, "pad_token_id": 1, "torch_dtype": "float16",
    },
    "Qwen/Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu", "head_dim": 128,
        "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
        "max_window_layers": 28, "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True, "use_sliding_window": False,
        "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
    },
}
#: The snapshot name every local model uses (the hub cache layout needs one; no real revision is claimed).
REVISION = "0" * 40


def write_hub_cache(cache: Path) -> Path:
    """Lay out ``MODELS`` under ``cache`` as huggingface_hub's cache (``models--org--name/refs/main`` and
    ``snapshots/<revision>/config.json``); returns ``cache``. Point ``HF_HUB_CACHE`` at it."""
    for repo_id, config in MODELS.items():
        model = cache / ("models--" + repo_id.replace("/", "--"))
        (model / "refs").mkdir(parents=True, exist_ok=True)
        (model / "refs" / "main").write_text(REVISION)
        snapshot = model / "snapshots" / REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text(json.dumps(config, indent=1))
    return cache
