"""Named subsets (``conformance --subset NAME``): what the smoke subset holds under each contract, how a run of it is
recorded (PARTIAL, named in results.json, summary.md and the merged page) and that verify never calls it
conformant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hisparse_hal.conformance import matrix_page, report
from hisparse_hal.conformance.contracts import HAL_CONTRACT, VLLM_034_CONTRACT
from hisparse_hal.conformance.mustpass import collect_suite, contract_ids, read_mustpass
from hisparse_hal.conformance.subsets import SUBSETS, subset_named
from hisparse_hal.conformance.verify import verify_folder
from hisparse_hal.errors import InvalidArgumentError

from .test_runner_usage import _conformance, _left_in_tmpdir, _the_one_line

#: The areas whose bytes the smoke subset must move once under every contract (the scenario tier is hal-only).
SMOKE_AREAS = {"probe", "surface", "swaps", "gathers", "pinning", "stats", "capture", "ipc", "cache_ops"}


@pytest.fixture(scope="module")
def collected():
    return collect_suite()


@pytest.mark.parametrize("contract", [HAL_CONTRACT, VLLM_034_CONTRACT], ids=lambda c: c.id)
def test_the_smoke_subset_covers_every_area_with_must_pass_tests_of_the_contract(collected, contract):
    taken = set(contract_ids(contract, collected))
    smoke = sorted(i for i, markers in collected if "smoke" in markers and i in taken)
    assert set(smoke) <= set(read_mustpass(contract)), "a smoke test a conformant backend need not pass"
    areas = {report.area_of(i) for i in smoke}
    assert SMOKE_AREAS <= areas, SMOKE_AREAS - areas
    if contract is HAL_CONTRACT:
        assert "scenario" in areas
    assert len(smoke) <= 15, smoke  # a first gate, not a second suite


def test_an_unknown_subset_is_named_with_the_known_ones():
    assert subset_named("smoke") is SUBSETS["smoke"]
    with pytest.raises(InvalidArgumentError, match=r"^--subset 'nope' is not a named subset of the suite; "
                                                   r"known: smoke$"):
        subset_named("nope")


def test_an_unknown_subset_is_one_line_before_any_work(tmp_path):
    done = _conformance(tmp_path, "--backend", "cpu", "--subset", "nope", "--report", str(tmp_path / "r"))
    assert _the_one_line(done) == ("hisparse-hal conformance: --subset 'nope' is not a named subset of the suite; "
                                   "known: smoke")
    assert _left_in_tmpdir(tmp_path) == [] and not (tmp_path / "r").exists()


def test_a_smoke_run_passes_is_recorded_by_name_and_is_not_conformant(tmp_path, collected):
    done = _conformance(tmp_path, "--backend", "cpu", "--subset", "smoke", "--report", str(tmp_path / "r"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert f"next: hisparse-hal verify {tmp_path / 'r'} (CONFORMANT or NOT CONFORMANT" in done.stdout
    doc = json.loads((tmp_path / "r" / "results.json").read_text(encoding="utf-8"))
    expected = sorted(i for i, markers in collected if "smoke" in markers)
    assert sorted(t["id"] for t in doc["tests"]) == expected
    assert doc["summary"]["passed"] == len(expected) and doc["verdict"] == "PASS (partial)"
    assert doc["mode"] == "subset" and doc["selection"]["subset"] == "smoke"
    assert doc["selection"]["full_suite"] is False
    summary = (tmp_path / "r" / "summary.md").read_text(encoding="utf-8")
    assert "a PARTIAL run (the named subset 'smoke'):" in summary
    checked = verify_folder(tmp_path / "r")
    assert not checked.conformant
    assert "mode: a subset of the suite ran (subset 'smoke', markexpr 'smoke'), not the full suite" in checked.reasons
    merged = matrix_page.merge([matrix_page.load_report(str(tmp_path / "r"))])
    assert merged["rows"][0]["mode"] == "subset smoke"


def test_a_report_without_a_subset_shows_its_mode_alone(tmp_path: Path):
    doc = {"mode": "full", "selection": {"full_suite": True}}
    assert matrix_page._mode(doc) == "full"
    assert matrix_page._mode({"selection": {"subset": "smoke"}}) == matrix_page.NOT_RECORDED
