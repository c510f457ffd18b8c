"""docs/kernels.md's tables are a rendering of the committed docs/kernels.json, so the page cannot drift from
its data; and ``hisparse-hal kernels --page`` / ``--from-json`` write exactly that rendering (no triton needed)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal import cli
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.kernels import page as kernel_page
from hisparse_hal.kernels import report as kernel_report
from hisparse_hal.kernels.report import KernelFacts

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE, DOCUMENT = DOCS / "kernels.md", DOCS / "kernels.json"


def _committed() -> dict[str, Any]:
    return kernel_page.load_payload(DOCUMENT)


def test_the_pages_generated_part_is_the_rendering_of_the_committed_document() -> None:
    page = PAGE.read_text()
    assert kernel_page.generated_part(page, str(PAGE)) == kernel_page.render(_committed()), (
        "docs/kernels.md's tables differ from docs/kernels.json: regenerate with "
        "hisparse-hal kernels --from-json docs/kernels.json --page docs/kernels.md (or recompile: --json)"
    )


def test_the_committed_document_is_one_whole_run_whose_summary_its_results_give() -> None:
    payload = _committed()
    assert payload["command"].startswith("hisparse-hal kernels --json docs/kernels.json")
    assert payload["triton"] and payload["date"][:2] == "20"
    assert payload["targets"] == list(kernel_report.TARGETS)
    facts = [KernelFacts(**result) for result in payload["results"]]
    assert kernel_report.summary(facts) == payload["summary"]
    assert all(f.compiled for f in facts) and len(facts) == 41 * len(kernel_report.TARGETS)


def test_a_changed_figure_changes_the_rendering() -> None:
    payload = _committed()
    changed = copy.deepcopy(payload)
    row = next(r for r in changed["results"] if r["production"] and r["target"] == "sm_90" and not r["variant"])
    row["registers"] = 254
    assert kernel_page.render(changed) != kernel_page.render(payload)
    expected = f"`{row['kernel']}` [{row['shape']}] | sm_90 | {row['shared_bytes']:,} | 254 |"
    assert expected in kernel_page.render(changed)


def test_spilling_cases_are_listed_with_the_compilers_own_figures() -> None:
    payload = copy.deepcopy(_committed())
    for row in payload["results"]:
        row["spill_bytes"] = 0
    assert "No case spills to memory on any target." in kernel_page.render(payload)
    row = payload["results"][0]
    row["spill_bytes"], row["spills"] = 32, {"stack_frame_bytes": 16, "spill_store_bytes": 12,
                                             "spill_load_bytes": 20}
    rendered = kernel_page.render(payload)
    assert f"| `{row['kernel']}` [{row['shape']}] | {row['target']} | {row['registers']} | 32 | stack frame 16 B, " \
           "spill store 12 B, spill load 20 B | - |" in rendered


def test_a_document_without_its_date_or_command_is_refused_by_name() -> None:
    payload = _committed()
    del payload["date"], payload["command"]
    with pytest.raises(InvalidArgumentError, match="has no date, command"):
        kernel_page.render(payload)


@pytest.mark.parametrize("text, found", [("no markers", "0 times"), (kernel_page.END + kernel_page.BEGIN, "1 times"),
                                         (kernel_page.BEGIN * 2 + kernel_page.END, "2 times")])
def test_a_page_without_one_ordered_pair_of_markers_is_refused(text: str, found: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"page.md' must hold the generated-part markers.*{found}"):
        kernel_page.replace_generated(text, "x", "'page.md'")


def _page(tmp_path: Path) -> Path:
    page = tmp_path / "page.md"
    page.write_text(f"# prose\n\n{kernel_page.BEGIN}\nold table\n{kernel_page.END}\n\nmore prose\n")
    return page


def test_from_json_rewrites_only_the_generated_part(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = _page(tmp_path)
    assert cli.main(["kernels", "--from-json", str(DOCUMENT), "--page", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# prose\n\n") and text.endswith("\n\nmore prose\n") and "old table" not in text
    assert kernel_page.generated_part(text) == kernel_page.render(_committed())
    assert f"wrote the generated part of {page}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--from-json", "DOC"], "--from-json renders an earlier document into --page without compiling: it takes "
                             "--page and nothing else (no --page given)"),
    (["--from-json", "DOC", "--page", "PAGE", "--dump", "d"], "nothing else (--dump given)"),
    (["--page", "PAGE"], "--page is rendered from the --json document of an offline compile"),
    (["--json", "x.json", "--page", "NOPAGE"], "must hold the generated-part markers once each"),
    (["--from-json", "BAD", "--page", "PAGE"], "is not a readable JSON document"),
])
def test_page_usage_errors_are_one_line_before_any_compiling(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kernel_report, "compile_cases", lambda *a, **k: pytest.fail("compiled"))
    page, unmarked, bad = _page(tmp_path), tmp_path / "plain.md", tmp_path / "bad.json"
    unmarked.write_text("# no markers\n")
    bad.write_text("{not json")
    names = {"DOC": str(DOCUMENT), "PAGE": str(page), "NOPAGE": str(unmarked), "BAD": str(bad)}
    before = page.read_text()
    assert cli.main(["kernels", *[names.get(a, a) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert page.read_text() == before


def test_the_json_document_records_its_date_and_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("triton", reason="the kernels command checks that triton is installed")
    facts = [KernelFacts(**r) for r in _committed()["results"]]
    monkeypatch.setattr(kernel_report, "compile_cases", lambda cases, targets, on_result=None: facts)
    out, page = tmp_path / "k.json", _page(tmp_path)
    assert cli.main(["kernels", "--json", str(out), "--page", str(page)]) == 0
    written = json.loads(out.read_text())
    assert written["command"] == f"hisparse-hal kernels --json {out} --page {page}"
    assert len(written["date"]) == 10 and written["summary"] == _committed()["summary"]
    assert kernel_page.generated_part(page.read_text()) == kernel_page.render(written)
