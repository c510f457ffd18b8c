"""The matrix page (conformance/matrix_page.py) as a person sees it: opened in headless Chromium from the OS
packages, its DOM read back after load (the table's cells, a failure cell's link target), no console errors, and a
screenshot; skipped with the reason where no Chromium is installed. Plus what the page holds without a browser."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal.conformance import matrix_page, matrix_plots
from tests.ci import matrix_reports as reports

BROWSER_TIMEOUT_S = 180
VOID = {"br", "meta", "img", "hr", "input", "link", "wbr"}


# ------------------------------------------------------------------------------------------ the DOM, read back
class _Dom(HTMLParser):
    """The matrix table's rows (cell texts and links) and the text inside every element that has an id."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[dict[str, Any]]] = []
        self.text_of_id: dict[str, str] = {}
        self._open: list[tuple[str, str | None]] = []
        self._in_matrix_body = False
        self._cell: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in VOID:
            if tag == "br":
                self._text(" ")
            return
        if tag == "span":  # spans are blocks here: the cell "FAIL 2/4 2 failed" is three lines on screen
            self._text(" ")
        self._open.append((tag, a.get("id")))
        if a.get("id"):
            self.text_of_id[str(a["id"])] = ""
        if tag == "tbody" and any(i == "matrix" for _, i in self._open):
            self._in_matrix_body = True
        elif self._in_matrix_body and tag == "tr":
            self.rows.append([])
        elif self._in_matrix_body and tag in ("td", "th"):
            self._cell = {"text": "", "links": [], "class": a.get("class") or ""}
            self.rows[-1].append(self._cell)
        elif tag == "a" and self._cell is not None and a.get("href"):
            self._cell["links"].append(a["href"])

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            name, _ = self._open.pop()
            if name == tag:
                break
        if tag in ("td", "th"):
            self._cell = None
        elif tag == "tbody":
            self._in_matrix_body = False
        elif tag == "span":
            self._text(" ")

    def handle_data(self, data: str) -> None:
        self._text(data)

    def _text(self, data: str) -> None:
        for _, ident in self._open:
            if ident:
                self.text_of_id[ident] += data
        if self._cell is not None:
            self._cell["text"] += data


def _squash(text: str) -> str:
    return " ".join(text.split())


def _read_dom(html: str) -> _Dom:
    dom = _Dom()
    dom.feed(html)
    return dom


# ------------------------------------------------------------------------------------------ Chromium
def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            probe = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
            if probe.returncode == 0 and "Chromium" in probe.stdout:
                return found
    pytest.skip("no Chromium on PATH (chromium or chromium-browser): .ci/run installs it with "
                "'apt-get install -y chromium' where it can; without it the matrix page's browser test cannot run")


def _open_in_chromium(browser: str, page: Path, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Load ``page`` in headless Chromium with a fresh profile under ``workdir``, logging console messages."""
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={workdir / 'profile'}", "--enable-logging=stderr", "--v=0", *extra, page.as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, cwd=workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def console_messages(stderr: str) -> list[str]:
    """Chromium's logged console messages (page script errors, ``console.*`` calls) from its stderr."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


@pytest.fixture(scope="module")
def browsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The six kinds of report merged, the page opened once in Chromium: its DOM, console and screenshot."""
    browser = _chromium()
    root = tmp_path_factory.mktemp("matrix-page")
    docs = [reports.full_pass(), reports.with_failures(), reports.cut_short(), reports.keyword_subset(),
            reports.strict_failure(), reports.format1(incomplete=True)]
    inputs = [matrix_page.load_report(str(reports.write(root / f"r{n}", doc, reports.real_bench() if n == 0 else None)))
              for n, doc in enumerate(docs)]
    page = matrix_page.write_outputs(root / "out", matrix_page.merge(inputs))["html"]
    dumped = _open_in_chromium(browser, page, root, "--dump-dom")
    shot = root / "matrix.png"
    shown = _open_in_chromium(browser, page, root, f"--screenshot={shot}", "--window-size=1400,900")
    return {"dom": _read_dom(dumped.stdout), "html": dumped.stdout, "console": console_messages(dumped.stderr)
            + console_messages(shown.stderr), "screenshot": shot, "root": root}


def test_the_table_shows_each_row_its_verdict_and_each_areas_counts(browsed):
    rows = [[_squash(c["text"]) for c in row] for row in browsed["dom"].rows]
    assert [r[0] for r in rows[:5]] == [
        "cpu (registry) on Intel Xeon Platinum 8480+ @ node-a", "cpu (registry) on AMD EPYC 9654 @ node-b",
        "cpu (registry) on Intel Xeon Gold 6338 @ node-c", "cpu (registry) on Intel Xeon Gold 6338 @ node-d",
        "cpu (registry) on Intel Xeon Gold 6338 @ node-e"]
    assert rows[5][0] == "cpu (registry) on cpu", "a format-1 report: no host recorded"
    assert [r[1].split(" ")[0] for r in rows] == ["PASS", "FAIL", "INCOMPLETE", "PASS", "FAIL", "INCOMPLETE"]
    assert rows[3][1] == "PASS (partial)"
    assert rows[0][2:5] == ["hisparse-hal-1 full", "2026-12-05 02:10 UTC", "0.9.0 0123456789"]
    assert rows[3][2] == "hisparse-hal-1 subset"
    assert rows[5][2:5] == ["not recorded not recorded", "not recorded", "not recorded"]
    areas = {a: 5 + n for n, a in enumerate(matrix_page.AREAS)}
    assert rows[0][areas["capture"]] == "PASS 1/1 1 skipped"
    assert rows[1][areas["swaps"]] == "FAIL 2/4 2 failed"
    assert rows[2][areas["cache_ops"]] == "INCOMPLETE 2/51", "an area cut short never reads PASS"
    assert rows[5][areas["cache_ops"]] == "INCOMPLETE 4/?"
    assert rows[1][areas["gathers"]] == "n/a"
    assert rows[4][1] == "FAIL --strict: 1 unmatched expectation entry"
    assert "v-fail" in browsed["dom"].rows[4][1]["class"]


def test_a_failure_cells_link_leads_to_that_failures_test_id_and_reason(browsed):
    dom = browsed["dom"]
    swaps_cell = dom.rows[1][5 + matrix_page.AREAS.index("swaps")]
    (link,) = swaps_cell["links"]
    target = _squash(dom.text_of_id[link.removeprefix("#")])
    assert "test_swaps.py::test_swaps_1 (failed): AssertionError: destination block 7 holds block 3's bytes" in target
    assert "test_swaps.py::test_swaps_2 (failed)" in target and "test_ipc.py" not in target
    (strict_link, *_) = dom.rows[4][1]["links"]
    assert "test_swaps.py::test_renamed_long_ago" in dom.text_of_id[strict_link.removeprefix("#")]
    every_link = [href for row in dom.rows for cell in row for href in cell["links"]]
    assert all(href.removeprefix("#") in dom.text_of_id for href in every_link), "every link has its target"


def test_the_page_loads_without_script_errors_and_draws_the_bench_plots(browsed):
    assert browsed["console"] == []
    assert "<script" not in browsed["html"]
    dom = browsed["dom"]
    assert "graph_capture" in dom.text_of_id["report-2-claims"]
    bench = _squash(dom.text_of_id["report-1-details"])
    assert "swap_blocks_batch, device to host, by block size" in bench and "656 B" in bench and "131072 rows" in bench
    assert browsed["html"].count('<svg class="chart"') == 2


def test_the_screenshot_is_taken(browsed):
    shot = browsed["screenshot"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_a_narrow_window_scrolls_the_table_alone_with_its_row_names_in_view(browsed):
    """At 700 px the table is wider than the window: it scrolls inside its box (the page itself does not), and the
    row names stay at the box's left edge once scrolled. Measured by a script in a copy of the page (the page has
    none), which writes what it measured into the DOM that Chromium dumps."""
    page = Path(browsed["root"]) / "out" / "index.html"
    measured = page.with_name("measured.html")
    probe = ("<script>const box=document.querySelector('#matrix').parentElement;box.scrollLeft=400;"
             "const name=document.querySelector('#matrix tbody th.name').getBoundingClientRect();"
             "document.body.dataset.measured=[document.documentElement.scrollWidth<=window.innerWidth,"
             "box.scrollWidth>box.clientWidth,box.scrollLeft>0,"
             "Math.abs(name.left-box.getBoundingClientRect().left)<1].join(',');</script>")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", probe + "</body>"), encoding="utf-8")
    done = _open_in_chromium(_chromium(), measured, Path(browsed["root"]), "--dump-dom", "--window-size=700,500")
    assert console_messages(done.stderr) == []
    found = re.search(r'data-measured="([^"]*)"', done.stdout)
    assert found is not None, done.stdout[:500]
    page_fits, table_scrolls, scrolled, name_in_view = found.group(1).split(",")
    assert (page_fits, table_scrolls, scrolled, name_in_view) == ("true", "true", "true", "true")


def test_the_console_check_sees_a_script_error(tmp_path):
    """The check above can fail: a page with a script error is caught."""
    browser = _chromium()
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>notDefinedAnywhere()</script></body></html>")
    done = _open_in_chromium(browser, page, tmp_path, "--dump-dom")
    assert any("Uncaught ReferenceError: notDefinedAnywhere" in line for line in console_messages(done.stderr))


# ------------------------------------------------------------------------------------------ without a browser
def test_the_page_is_self_contained_and_escapes_what_reports_hold(tmp_path):
    doc = reports.with_failures()
    doc["tests"][4]["reason"] = "<script>alert(1)</script> & more"
    merged = matrix_page.merge([matrix_page.ReportInput(None, doc, str(tmp_path / "results.json"))])
    page = matrix_page.render_html(merged)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt; &amp; more" in page
    assert not re.search(r"""(src=|<link|@import|url\(|href=["']?(https?:|//))""", page), "nothing is fetched"


def test_bench_charts_draw_one_bar_per_figure_with_its_value():
    charts = matrix_plots.bench_charts(reports.real_bench())
    svgs = [c for c in charts if c.startswith("<svg")]
    assert len(svgs) == 2
    bars = re.findall(r"<rect [^>]*><title>([^<]*)</title></rect>", svgs[0])
    assert len(bars) == 4 * 3 and bars[0] == "656 B, ours: 0.873 GB/s"
    assert len(re.findall(r"<rect [^>]*><title>", svgs[1])) == 3 * 3


def test_a_missing_figure_leaves_its_bar_out():
    bench = {"swaps": [{"block_bytes": 4096, "ours_gbps": 2.0, "loop_gbps": None, "one_copy_gbps": "fast"}]}
    (svg,) = matrix_plots.bench_charts(bench)
    assert re.findall(r"<title>([^<]*)</title></rect>", svg) == ["4 KiB, ours: 2 GB/s"]


def test_cache_ops_figures_plot_one_step_per_case_and_implementation():
    """The shape ``bench --cache-ops --json`` writes: ``figures`` with a ``case`` and seconds per step."""
    figures = [{"case": {"requests": r, "queries": 1}, "implementation": impl, "step_s": s}
               for r, impl, s in ((64, "oracle", 0.020), (64, "host", 0.001), (128, "host", 0.0025))]
    (svg,) = matrix_plots.bench_charts({"device": "cpu", "figures": figures})[1:]
    bars = re.findall(r"<title>([^<]*)</title></rect>", svg)
    assert bars == ["64 req x 1 q, oracle: 20 ms", "64 req x 1 q, host: 1 ms", "128 req x 1 q, host: 2.5 ms"]


def test_a_bench_json_without_figures_says_so_on_the_page(tmp_path):
    folder = reports.write(tmp_path / "r", reports.full_pass(), {"backend": "cpu"})
    page = matrix_page.render_html(matrix_page.merge([matrix_page.load_report(str(folder))]))
    assert "bench.json holds no figures this page can plot." in page and "<svg" not in page


def test_a_run_from_a_plain_install_reads_not_a_checkout_as_its_header_does(tmp_path):
    doc = reports.full_pass()
    doc["run"]["commit"] = None  # recorded: hisparse-hal was not installed from a git checkout
    (row,) = matrix_page.merge([matrix_page.ReportInput(None, doc, str(tmp_path / "results.json"))])["rows"]
    assert row["commit"] == "not a checkout"
    assert "0.9.0<br>not a checkout" in matrix_page.render_html(matrix_page.merge(
        [matrix_page.ReportInput(None, doc, str(tmp_path / "results.json"))]))
    del doc["run"]["commit"]  # not recorded at all
    (row,) = matrix_page.merge([matrix_page.ReportInput(None, doc, str(tmp_path / "results.json"))])["rows"]
    assert row["commit"] == matrix_page.NOT_RECORDED
