"""The README's engine example runs as written, on the backend this machine selects."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_engine_example_runs_and_moves_the_right_bytes():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "the README should hold exactly one python example"
    scope: dict = {}
    exec(compile(blocks[0], str(README), "exec"), scope)  # noqa: S102 - our own README
    cache, staging = scope["kv_caches"]["layer.0"], scope["staging"]
    assert cache.shape == (64, 16, 656) and cache.dtype.itemsize == 1
    # The example unpins the pool at the end; the bytes it spilled are still there to check.
    pool = scope["pool"]
    assert bytes(pool[0].tolist()) == bytes(cache[3].reshape(-1).tolist())
    assert staging.tolist()[0] == cache.reshape(-1, 656)[5].tolist()
    assert bytes(pool[1].tolist()) == bytes(cache[7].reshape(-1).tolist())
    assert staging.tolist()[1] == cache.reshape(-1, 656)[17].tolist()
    assert staging.tolist()[2] == cache.reshape(-1, 656)[0].tolist()
    assert cache.float().std() > 0  # random bytes, not zeros
