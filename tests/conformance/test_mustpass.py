"""Must-pass lists and the suite hash: the committed lists are what the suite collects for each contract, and the
hash changes with any test file or list (issue 31)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hisparse_hal.conformance.contracts import CONTRACTS, HAL_CONTRACT, VLLM_034_CONTRACT
from hisparse_hal.conformance.mustpass import (
    REGENERATE,
    collect_suite,
    contract_ids,
    read_mustpass,
    suite_digest,
    suite_files,
    write_mustpass,
)
from hisparse_hal.errors import InvalidArgumentError

CONFORMANCE = Path(__file__).resolve().parents[2] / "conformance"


def test_the_committed_lists_are_what_the_suite_collects_for_each_contract():
    collected = collect_suite()
    for contract in CONTRACTS.values():
        expected = contract_ids(contract, collected)
        assert read_mustpass(contract) == expected, (
            f"conformance/mustpass/{contract.id}.txt is stale; regenerate it: {REGENERATE}"
        )
    extensions = {test_id for test_id, markers in collected if "hal_extension" in markers}
    assert set(read_mustpass(HAL_CONTRACT)) - set(read_mustpass(VLLM_034_CONTRACT)) == extensions
    assert len(read_mustpass(HAL_CONTRACT)) == len(collected)


def test_a_contract_with_an_excluding_marker_leaves_those_tests_out():
    collected = [("test_b.py::t", frozenset({"hal_extension"})), ("test_a.py::t", frozenset()),
                 ("test_a.py::u[1]", frozenset({"parametrize"}))]
    assert contract_ids(HAL_CONTRACT, collected) == ["test_a.py::t", "test_a.py::u[1]", "test_b.py::t"]
    assert contract_ids(VLLM_034_CONTRACT, collected) == ["test_a.py::t", "test_a.py::u[1]"]


def test_lists_round_trip_and_a_missing_list_names_the_command(tmp_path):
    path = write_mustpass(HAL_CONTRACT, ["test_b.py::t", "test_a.py::t"], tmp_path)
    assert path == tmp_path / "hisparse-hal-1.txt" and path.read_text().startswith("# must-pass list")
    assert read_mustpass(HAL_CONTRACT, tmp_path) == ["test_a.py::t", "test_b.py::t"]
    with pytest.raises(InvalidArgumentError, match=r"'vllm-0.34.0' cannot be read .*" + REGENERATE.replace(".", r"\.")):
        read_mustpass(VLLM_034_CONTRACT, tmp_path)


def test_the_suite_hash_covers_every_test_file_and_list_and_changes_with_any_of_them(tmp_path):
    files = [p.as_posix() for p in suite_files()]
    assert "tests/test_swaps.py" in files and "tests/__init__.py" in files
    assert "mustpass/hisparse-hal-1.txt" in files and "mustpass/vllm-0.34.0.txt" in files
    assert files == sorted(files) and not any(f.endswith(("plugin.py", "report.py")) for f in files)
    copy = tmp_path / "conformance"
    shutil.copytree(CONFORMANCE / "tests", copy / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(CONFORMANCE / "mustpass", copy / "mustpass")
    installed = suite_digest()
    assert suite_digest(copy) == installed and len(installed["sha256"]) == 64
    for rel in ("tests/test_stats.py", "mustpass/vllm-0.34.0.txt"):
        target = copy / rel
        original = target.read_bytes()
        target.write_bytes(original + b"\n")
        assert suite_digest(copy)["sha256"] != installed["sha256"], f"editing {rel} left the hash unchanged"
        target.write_bytes(original)
    (copy / "tests" / "test_extra.py").write_text("")
    assert suite_digest(copy)["sha256"] != installed["sha256"], "a new test file left the hash unchanged"
