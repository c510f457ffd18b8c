"""The conformance suite's pytest plugin: options, markers, the ``backend`` fixture, tier gating,
expectations, the report header and the results report. Load it with ``-p hisparse_hal.conformance.plugin``.

Invariants: the probe tier runs first and, if any of its tests fails, every later test is skipped
with a reason saying so (under xdist the controller publishes the probe tier's outcome to the workers
through a gate file); tests skip by capability, never by vendor name; every expected failure is strict.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal.errors import HalError

from . import SUITE_VERSION, run_record
from .collection import pytest_collect_directory, pytest_pycollect_makemodule  # noqa: F401 - hooks of this plugin
from .expectations import Expectations, backend_architectures, load_expectations
from .junit import CAPABILITY_SKIP_PREFIX, PROBE_GATE_SKIP_PREFIX
from .mustpass import suite_digest
from .process_facts import (
    backend_facts,
    device_identity_of,
    environment_facts,
    publish_worker_facts,
    published_facts,
    record_processes,
)
from .recipe import BackendRecipe
from .report import (
    AREAS,
    ResultCollector,
    area_of,
    build_results,
    overall_verdict,
    report_lines,
    suite_test_id,
    terminal_lines,
    write_report,
)
from .resolved_run import ResolvedRun
from .selection import Selection
from .subsets import SUBSETS

pytest_plugins = ("hisparse_hal.conformance.fixtures",)

STATE_KEY = pytest.StashKey["ConformanceState"]()
GATE_WAIT_S = 900.0
#: The ``user_properties`` name under which a claims-tier test records a denied capability that works.
CLAIM_PROPERTY = "hal_claim"


class UnmatchedExpectationWarning(UserWarning):
    """An expectations entry matched no test of the suite (a stale id or a typo)."""


class ConformanceState:
    """Per-process state of a conformance run: the resolved run (read from ``--hal-run``, handed down by the
    xdist controller, or resolved here once) and the backend, built once, in ``pytest_configure``."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.run = _resolved_run(config)
        self.recipe: BackendRecipe = self.run.recipe
        self.contract = self.run.contract_info()
        self.strict = bool(config.getoption("hal_strict"))
        self.report_dir = config.getoption("hal_report")
        self._backend: Any = None
        self._backend_error: BaseException | None = None
        self.backend_facts: dict[str, Any] = {}
        if self.run.expectations_pending:  # a factory function: its class is known once it has built the backend
            self.run = self.run.with_expectations_of(self.backend())
        self.expectations_path = self.run.expectations
        self.expectations = load_expectations(self.expectations_path) if self.expectations_path else Expectations()
        self.unmatched: list[str] = []
        self.probe_failures: list[str] = []
        self.collector = ResultCollector()
        self.gate_file: str | None = getattr(config, "workerinput", {}).get("hal_gate_file")
        self.pending_probe: set[str] | None = None
        self.finished_incomplete: dict[str, Any] | None = None
        self.running_now: set[str] = set()  # tests started and not finished (several under xdist)
        self.environment: dict[str, Any] | None = None
        self.started = time.time()
        self.finished: float | None = None
        self.selection = Selection(config)
        self.claims: list[dict[str, Any]] = []  # denied capabilities a claims-tier probe found working
        self.record_facts: dict[str, Any] | None = None  # the run's format-2 facts, read once
        self.resumed: set[str] = set()
        #: What each test process of the run tested (label -> run_record.process_identity), cross-checked.
        self.processes: dict[str, dict[str, Any]] = {}
        resume = config.getoption("hal_resume")
        if resume:
            earlier = json.loads(Path(resume).read_text(encoding="utf-8"))
            self.collector.restore(earlier["tests"])
            self.processes.update((earlier.get("facts") or {}).get("processes") or {})
            self.claims = list(earlier.get("claims") or [])
            self.resumed = {t["id"] for t in earlier["tests"]}
            self.probe_failures = [
                t["id"] for t in earlier["tests"] if t["area"] == "probe" and t["outcome"] in ("failed", "xpassed")
            ]

    def backend(self) -> Any:
        """The backend under test, built once per process (on the first call, from ``pytest_configure``)."""
        if self._backend is None and self._backend_error is None:
            try:
                self._backend = self.run.build()
                self.backend_facts = backend_facts(self._backend)
                self.backend_facts["device_identity"] = device_identity_of(self._backend, self.run.probe_facts())
                self.backend_facts["process"] = self.process_label()
            except BaseException as exc:  # re-raised by every test that needs the backend
                self._backend_error = exc
        if self._backend_error is not None:
            raise self._backend_error
        return self._backend

    def process_label(self) -> str:
        """This test process's name in the report: its xdist worker id (``main`` without xdist) and its pid, which
        tells a process resumed after a crash from the one that crashed."""
        worker = getattr(self.config, "workerinput", {}).get("workerid", "main")
        return f"{worker} (pid {os.getpid()})"

    def architectures(self) -> tuple[str, ...]:
        try:
            backend = self.backend()
        except BaseException:  # noqa: BLE001 - reported by the tests themselves
            return ()
        return backend_architectures(backend.capabilities.versions, self.run.probe_facts())


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process is pytest-xdist's controller (it runs no test; its workers collect and run them)."""
    return bool(config.getoption("numprocesses", None)) and not _is_worker(config)


def _resolved_run(config: pytest.Config) -> ResolvedRun:
    """The run's resolution: ``--hal-run`` (the runner's), the xdist controller's, or resolved here once."""
    given = config.getoption("hal_run")
    if given:
        return ResolvedRun.read(given)
    inherited = getattr(config, "workerinput", {}).get("hal_run")
    if inherited:
        return ResolvedRun.from_json(inherited)
    return ResolvedRun.resolve(config.getoption("hal_backend"), config.getoption("hal_factory"),
                               config.getoption("hal_expectations"), config.getoption("hal_vllm_backend"))


# ------------------------------------------------------------------------------------------ options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hisparse-hal", "hisparse-hal conformance")
    group.addoption(
        "--hal-backend",
        default=None,
        metavar="NAME",
        help="registry name of the backend under test (strict); default: what get_backend() selects",
    )
    group.addoption(
        "--hal-factory", default=None, metavar="MODULE:CALLABLE", help="build an unregistered backend by calling this"
    )
    group.addoption("--hal-vllm-backend", default=None, metavar="MODULE:CLASS",
                    help="test a class implementing vLLM 0.34.0's HiSparseBackend (contract vllm-0.34.0)")
    group.addoption(
        "--hal-expectations",
        default=None,
        metavar="FILE",
        help="expectations TOML; default: the vendor's expectations.toml; 'none' for no file",
    )
    group.addoption("--hal-report", default=None, metavar="DIR", help="write results.json and summary.md here")
    group.addoption(
        "--hal-strict", action="store_true", default=False, help="expectation entries that match no test fail the run"
    )
    group.addoption("--hal-subset", default=None, metavar="NAME",
                    help="(set by the runner with its -m) the named subset the run selected, recorded in the report")
    group.addoption("--hal-pytest-args", default="", metavar="ARGS",
                    help="(set by the runner) the further pytest arguments the user gave, recorded in the report")
    group.addoption("--hal-deferred-interrupts", action="store_true", default=False,
                    help="(set by the runner, which starts pytest with SIGINT blocked) take SIGINT only between "
                    "the end of collection and the session's end")
    group.addoption("--hal-run", default=None, metavar="RUN_JSON",
                    help="(set by the runner) the run it resolved: recipe, expectations file and probe results; "
                    "without it this process resolves them itself")
    group.addoption("--hal-resume", default=None, metavar="RESULTS_JSON",
                    help="(used by the runner after a crash) keep these results and run only the tests they lack")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs(*capabilities): skip unless each named Capabilities flag is true (the reason names it)"
    )
    for subset in SUBSETS.values():
        config.addinivalue_line("markers", f"{subset.marker}: in the named subset {subset.name!r} ({subset.purpose})")
    config.addinivalue_line(
        "markers",
        "hal_extension: beyond vLLM 0.34.0's contract (a member hisparse-hal adds, or a behaviour vLLM's members do "
        "not promise); not in the vLLM contract's suite (see conformance/contracts.py)",
    )
    for option, flag in (("setupplan", "--setup-plan"), ("setuponly", "--setup-only")):
        if config.getoption(option, False):  # pytest reports every test passed without running it
            raise pytest.UsageError(f"hisparse-hal conformance: {flag} runs no test, and pytest would report each "
                                    "as passed; a conformance run is its tests")
    try:
        state = ConformanceState(config)
    except HalError as exc:
        raise pytest.UsageError(f"hisparse-hal conformance: {exc}") from exc
    except Exception as exc:  # a factory that raised while building the backend
        raise pytest.UsageError(
            f"hisparse-hal conformance: building the backend failed: {type(exc).__name__}: {exc}"
        ) from exc
    config.stash[STATE_KEY] = state
    config.pluginmanager.register(RunHooks(state), "hisparse-hal-conformance-run")
    if not _is_xdist_controller(config):  # the xdist controller runs no test
        try:
            state.backend()  # built once, here; a failure is reported by the header and by every test that needs it
        except BaseException:  # noqa: BLE001 - kept by the state, re-raised where the backend is used
            pass
        _publish_worker_facts(state)


def _publish_worker_facts(state: ConformanceState) -> None:
    """An xdist worker publishes its backend's facts at once (see :func:`process_facts.publish_worker_facts`)."""
    if not (_is_worker(state.config) and state.gate_file and state.backend_facts):
        return
    worker = state.config.workerinput.get("workerid", "gw")  # type: ignore[attr-defined]
    publish_worker_facts(state.gate_file, worker, state.backend_facts)


def _worker_facts(state: ConformanceState) -> dict[str, Any]:
    """The backend facts the first xdist worker published (empty: none yet)."""
    published = published_facts(state.gate_file)
    return published[0] if published else {}


def _processes(state: ConformanceState) -> dict[str, dict[str, Any]]:
    """Every test process of the run so far with what it tested: this process (when it built the backend), the
    xdist workers, and the processes of the run before a crash (from the report it resumes). Kept in the state,
    so the report written after the workers' files are removed still lists them."""
    return record_processes(state.processes, [state.backend_facts, *published_facts(state.gate_file)])


# The runner starts pytest with SIGINT blocked: an interrupt while modules import (pytest's plugins, the test
# modules, hypothesis) would leave half-imported modules and tracebacks. It is unblocked once the tests are
# collected (the xdist controller collects nothing: once its session starts) and blocked again when the session
# finishes, so that writing the report cannot be cut short; an interrupt in between is pytest's to handle.
# Only when the runner says so (--hal-deferred-interrupts): other pytest processes keep their signal mask.
def _accept_interrupts(config: pytest.Config, accept: bool) -> None:
    import signal

    if config.getoption("hal_deferred_interrupts", False):
        signal.pthread_sigmask(signal.SIG_UNBLOCK if accept else signal.SIG_BLOCK, {signal.SIGINT})


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_xdist_controller(session.config):
        _accept_interrupts(session.config, True)


def pytest_collection_finish(session: pytest.Session) -> None:
    _accept_interrupts(session.config, True)


def state_of(config: pytest.Config) -> ConformanceState:
    """The run's :class:`ConformanceState`."""
    return config.stash[STATE_KEY]


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# ------------------------------------------------------------------------------------------ header
def pytest_report_header(config: pytest.Config) -> list[str]:
    import torch

    from hisparse_hal.registry import format_probe_table

    state = state_of(config)
    results = state.run.probe_results()
    lines = [
        f"hisparse-hal conformance suite {SUITE_VERSION}; backend under test: {state.recipe.describe()}",
        f"expectations: {state.expectations_path or 'none'} ({len(state.expectations.entries)} "
        f"entr{'y' if len(state.expectations.entries) == 1 else 'ies'})"
        + ("; strict" if state.strict else ""),
        f"torch {torch.__version__} (cuda {torch.version.cuda}, hip {getattr(torch.version, 'hip', None)}); "
        f"python {platform.python_version()}; {platform.platform()}",
        "HISPARSE_* environment: "
        + (", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("HISPARSE_")) or "none set"),
        "probe table:",
    ]
    lines += ["  " + line for line in format_probe_table(results, state.recipe.registry_name).splitlines()]
    for r in results:
        if r.facts:
            lines.append(f"  {r.name} facts: " + ", ".join(f"{k}={v}" for k, v in r.facts.items()))
    if not config.getoption("numprocesses", None):  # under xdist only the workers build the backend
        try:
            facts = state.backend_facts or backend_facts(state.backend())
        except Exception as exc:  # noqa: BLE001 - every test reports it too
            lines.append(f"backend under test could not be built: {type(exc).__name__}: {exc}")
        else:
            caps = facts["capabilities"]
            lines.append(f"backend under test: {facts['backend_class']} on {facts['device']}; "
                         f"architectures: {', '.join(facts['architectures']) or 'n/a'}")
            lines.append(
                "runtime versions: " + (", ".join(f"{k}={v}" for k, v in caps["versions"].items()) or "none reported")
            )
    return lines


# ------------------------------------------------------------------------------------------ collection
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Probe tier first; expectations applied as strict xfail or skip marks; stale entries warned."""
    state = state_of(config)
    _drop_tests_outside_the_contract(state, items)
    if state.resumed:  # a run resumed after a crash: the tests already recorded do not run again
        done = [item for item in items if suite_test_id(item.nodeid) in state.resumed]
        items[:] = [item for item in items if suite_test_id(item.nodeid) not in state.resumed]
        config.hook.pytest_deselected(items=done)
    order = {area: n for n, area in enumerate(AREAS)}
    items.sort(key=lambda item: order.get(area_of(item.nodeid), len(order)))  # stable: tier order, probe first
    expectations = state.expectations
    if not expectations.entries:
        return
    archs = state.architectures() if expectations.needs_architectures() else ()
    for item in items:
        entry = expectations.lookup(suite_test_id(item.nodeid), archs)
        if entry is None:
            continue
        if entry.status == "xfail":
            item.add_marker(pytest.mark.xfail(reason=entry.describe(), strict=True))
        else:
            item.add_marker(pytest.mark.skip(reason=entry.describe()))
    state.unmatched = [
        f"{e.id} ({e.status}): {e.reason}" for e in expectations.unmatched(suite_test_id(i.nodeid) for i in items)
    ]
    for text in state.unmatched:
        warnings.warn(UnmatchedExpectationWarning(f"expectation entry matches no test: {text}"), stacklevel=1)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> list[Any] | None:
    """A test the run's contract excludes is not collected at all (the counts pytest prints leave it out)."""
    marker = state_of(collector.config).contract.excludes_marker
    if not marker or not callable(obj) or not name.startswith("test"):
        return None
    own = [m.name for m in getattr(obj, "pytestmark", [])]
    if marker in own or collector.get_closest_marker(marker) is not None:
        return []
    return None


def _drop_tests_outside_the_contract(state: ConformanceState, items: list[pytest.Item]) -> None:
    """Remove the tests the run's contract excludes (not collected: neither deselected nor a partial run)."""
    marker = state.contract.excludes_marker
    if marker:
        items[:] = [item for item in items if item.get_closest_marker(marker) is None]


# ------------------------------------------------------------------------------------------ gating
def _gate_from_file(state: ConformanceState) -> list[str]:
    """Wait for the controller's verdict on the probe tier; the failed probe tests (empty: passed)."""
    assert state.gate_file is not None
    deadline = time.monotonic() + GATE_WAIT_S
    while time.monotonic() < deadline:
        try:
            verdict = json.loads(Path(state.gate_file).read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
            continue
        return list(verdict.get("failed", []))
    return [f"(the probe tier did not finish within {GATE_WAIT_S:.0f} s)"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    state = state_of(item.config)
    if area_of(item.nodeid) != "probe":
        failed = list(state.probe_failures)
        if not failed and state.gate_file is not None:
            failed = _gate_from_file(state)
        if failed:
            pytest.skip(
                f"{PROBE_GATE_SKIP_PREFIX}({', '.join(failed[:5])}{', ...' if len(failed) > 5 else ''}); "
                "the rest of the suite is skipped until the probe tier passes"
            )
    for mark in item.iter_markers("needs"):
        backend = state.backend()
        for capability in mark.args:
            value = getattr(backend.capabilities, capability)
            if not value:
                pytest.skip(
                    f"{CAPABILITY_SKIP_PREFIX}{capability} is {value!r} on {backend.name!r}; this test needs it"
                )


def _write_gate(state: ConformanceState, failed: list[str]) -> None:
    assert state.gate_file is not None
    tmp = state.gate_file + ".tmp"
    Path(tmp).write_text(json.dumps({"failed": failed}))
    os.replace(tmp, state.gate_file)


class RunHooks:
    """Hooks that need the run's state: result collection, and the probe gate under xdist."""

    def __init__(self, state: ConformanceState) -> None:
        self.state = state

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        state = self.state
        state.running_now.add(suite_test_id(nodeid))
        if not _is_worker(state.config) and state.report_dir:
            # Kept current so that a crash (a segfault in a vendor library) still leaves a report naming
            # the test that was running; the runner completes it (see runner.complete_crashed_report).
            write_report(state.report_dir, _document(state, running=suite_test_id(nodeid)))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        _accept_interrupts(session.config, False)  # see _accept_interrupts

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.state.running_now.discard(suite_test_id(nodeid))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        is_probe = area_of(report.nodeid) == "probe"
        if is_probe and report.failed:
            state.probe_failures.append(suite_test_id(report.nodeid))
        if _is_worker(state.config):
            return
        state.collector.add(report)
        _take_claims(state, report)
        if state.pending_probe is not None and is_probe:  # xdist controller: publish the probe verdict
            if report.failed:
                _write_gate(state, state.probe_failures)
            elif report.when == "teardown":
                state.pending_probe.discard(report.nodeid)
                if not state.pending_probe and not state.probe_failures:
                    _write_gate(state, [])

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        resumed = self.state.resumed
        self.state.selection.deselected += sum(1 for item in items if suite_test_id(item.nodeid) not in resumed)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        state = self.state
        if _is_xdist_controller(state.config) or state.selection.selected_ids:
            return  # the xdist controller learns them from a worker (pytest_xdist_node_collection_finished)
        ids = [suite_test_id(item.nodeid) for item in session.items]
        # A resumed run: both parts (the last resume may have nothing left to run, yet its selection is whole).
        state.selection.selected_ids = ids + sorted(state.resumed)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        state = self.state
        if state.gate_file is None:
            state.gate_file = os.path.join(tempfile.mkdtemp(prefix="hisparse-gate-"), "probe-tier.json")
        node.workerinput["hal_gate_file"] = state.gate_file
        node.workerinput["hal_run"] = state.run.to_json()  # the workers resolve nothing again

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        state = self.state
        if not state.selection.selected_ids:
            state.selection.selected_ids = [suite_test_id(nodeid) for nodeid in ids] + sorted(state.resumed)
        if state.pending_probe is None:
            state.pending_probe = {nodeid for nodeid in ids if area_of(nodeid) == "probe"}
            if not state.pending_probe:
                _write_gate(state, [])

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        state = self.state
        output = getattr(node, "workeroutput", {}) or {}
        if "hal_deselected" in output:  # every worker collects the same suite: one worker's count is the run's
            state.selection.deselected = int(output["hal_deselected"])
        if output.get("hal_backend_facts") and not state.backend_facts:
            state.backend_facts = json.loads(output["hal_backend_facts"])
        for text in json.loads(output.get("hal_unmatched", "[]")):
            if text not in state.unmatched:
                state.unmatched.append(text)


def _take_claims(state: ConformanceState, report: pytest.TestReport) -> None:
    """Keep the claims a claims-tier test recorded (``record_property(CLAIM_PROPERTY, json)``), one per capability."""
    for name, value in getattr(report, "user_properties", ()) or ():
        if name != CLAIM_PROPERTY:
            continue
        claim = json.loads(value) if isinstance(value, str) else dict(value)
        if all(c.get("capability") != claim.get("capability") for c in state.claims):
            state.claims.append(claim)


# ------------------------------------------------------------------------------------------ finish
def _record_facts(state: ConformanceState) -> dict[str, Any]:
    """The run's format-2 facts that do not change while it runs (read once): contract, suite, commit, version,
    the vendor's expectations file."""
    if state.record_facts is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            hal_version: str | None = version("hisparse-hal")
        except PackageNotFoundError:
            hal_version = None
        state.record_facts = {"contract": run_record.contract_of(state.run).as_dict(), "suite": suite_digest(),
                              "version": hal_version, "commit": run_record.checkout_commit()}
    return state.record_facts


def _vendor_expectations(state: ConformanceState) -> str | None:
    """The vendor's installed expectations file for the built backend's class (None: none, or not built)."""
    from .qualnames import load_factory
    from .resolved_run import expectations_for_class

    qualname = state.backend_facts.get("backend_class") or state.run.backend_class
    if not qualname or ":" not in qualname:
        return None
    try:
        return expectations_for_class(load_factory(qualname))
    except Exception:  # noqa: BLE001 - a class that cannot be imported here has no known vendor file
        return None


def _format2(state: ConformanceState, doc: dict[str, Any], finished: float | None) -> dict[str, Any]:
    """Add results.json format 2's keys to ``doc`` (see run_record)."""
    fixed = _record_facts(state)
    facts = doc["facts"]
    device = facts.get("device_identity") or run_record.device_identity(str(facts.get("device", "?")), {}, {})
    doc["format"] = run_record.FORMAT
    doc["contract"] = fixed["contract"]
    doc["suite"] = fixed["suite"]
    doc["mode"] = "full" if doc["selection"].get("full_suite") else "subset"
    doc["backend_under_test"] = run_record.backend_under_test(state.recipe, facts)
    doc["run"] = run_record.run_block(state.started, finished, device, fixed["version"], fixed["commit"])
    doc["claims"] = list(state.claims)
    if "expectations_record" not in fixed and state.backend_facts:
        fixed["expectations_record"] = run_record.expectations_record(state.expectations_path,
                                                                      _vendor_expectations(state))
    doc["expectations"].update(fixed.get("expectations_record")
                               or run_record.expectations_record(state.expectations_path, None))
    doc["verdict"] = overall_verdict(doc)
    return doc


def _document(state: ConformanceState, running: str | None = None,
              incomplete: dict[str, Any] | None = None, finished: float | None = None) -> dict[str, Any]:
    if state.environment is None:
        state.environment = environment_facts(state.run)
    if not state.backend_facts:  # the xdist controller builds no backend: a worker's facts
        state.backend_facts = _worker_facts(state)
    facts = dict(state.environment)
    facts.update({k: v for k, v in state.backend_facts.items() if k != "process"})
    processes = _processes(state)
    facts["processes"] = processes
    mismatch = run_record.device_mismatch(processes)
    facts["architectures"] = sorted(
        set(facts.get("architectures", [])) | set(backend_architectures({}, facts.get("probe", {})))
    )
    facts["duration_s"] = round(time.time() - state.started, 2)
    backend = state.recipe.registry_name or str(state.recipe.factory or state.recipe.vllm_class)
    doc = build_results(
        SUITE_VERSION,
        backend,
        facts,
        state.collector.results(),
        {"expectations": {"file": state.expectations_path, "strict": state.strict, "unmatched": state.unmatched},
         "selection": state.selection.as_dict(),
         **({"incomplete": {"running": running, "reason": "the run is in progress, or its process died"}}
            if running else {}),
         **({"incomplete": incomplete} if incomplete else {}),
         **({"device_mismatch": mismatch} if mismatch else {})},
    )
    return _format2(state, doc, finished)


def _unfinished(state: ConformanceState, session: pytest.Session) -> dict[str, Any] | None:
    """Why the run ended before every selected test had an outcome (None: it did not)."""
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        cut = sorted(state.running_now)
        for test_id in cut:  # its setup may have passed, the test did not: it has no outcome
            state.collector.discard(test_id)
        # Not which signal: under the runner a SIGTERM reaches pytest as SIGINT; the runner names it in the
        # report it marks afterwards (and in its last line).
        return {"reason": "the run was interrupted before every selected test ran",
                **({"running": ", ".join(cut)} if cut else {})}
    selected = set(state.selection.selected_ids) - state.resumed
    missing = selected - {r.id for r in state.collector.results()}
    if selected and missing:
        return {"reason": f"the run stopped with {len(missing)} of {len(selected)} selected tests not run "
                          "(-x, --maxfail or an internal error)"}
    return None


def _lists_only(config: pytest.Config) -> bool:
    """Whether pytest only lists the tests (``--collect-only``): no run, so no report and no verdict."""
    return bool(config.getoption("collectonly", False))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if _lists_only(config):
        return
    state = state_of(config)
    if _is_worker(config):
        config.workeroutput["hal_backend_facts"] = json.dumps(state.backend_facts, default=str)  # type: ignore[attr-defined]
        config.workeroutput["hal_unmatched"] = json.dumps(state.unmatched)  # type: ignore[attr-defined]
        config.workeroutput["hal_deselected"] = state.selection.deselected  # type: ignore[attr-defined]
        return
    state.finished_incomplete = _unfinished(state, session)
    state.finished = time.time()
    final = _document(state, incomplete=state.finished_incomplete, finished=state.finished)  # reads worker facts
    # One rule: the exit status agrees with the report's verdict (a --strict entry that matched no test, test
    # processes on different devices, or tests that never ran fail a run whose tests all passed).
    if session.exitstatus == 0 and final["verdict"] in ("FAIL", "INCOMPLETE"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if state.report_dir:
        write_report(state.report_dir, final)
    if state.gate_file:
        shutil.rmtree(Path(state.gate_file).parent, ignore_errors=True)  # the gate file and the workers' facts


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _lists_only(config):
        return
    state = state_of(config)
    if _is_worker(config):
        return
    doc = _document(state, incomplete=state.finished_incomplete, finished=state.finished)
    terminalreporter.section("hisparse-hal conformance")
    for line in terminal_lines(doc):
        terminalreporter.write_line(line)
    for claim in doc["claims"]:
        terminalreporter.write_line(f"warning: the backend denies {claim['capability']}, but a probe found it "
                                    f"working: {claim['evidence']}")
    if state.unmatched:
        verb = "FAIL (--strict)" if state.strict else "warning"
        for text in state.unmatched:
            terminalreporter.write_line(f"{verb}: expectation entry matches no test: {text}")
    if state.report_dir:
        for line in report_lines(state.report_dir):
            terminalreporter.write_line(line)
