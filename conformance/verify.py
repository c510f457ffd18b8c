"""``hisparse-hal verify REPORT_DIR``: is a conformance report a conformant submission, checked against the suite
installed here.

Invariant: CONFORMANT only when the report is format 2 and whole (schema), of a full, finished run with verdict PASS,
of this exact suite (its hash), every must-pass test of its contract present with an allowed outcome (passed;
skipped for a named missing capability the report's own capabilities deny, or as not applicable to this kind of
backend; an expected failure from the vendor's committed expectations file, unmodified), and every test process on
one backend and device; otherwise NOT CONFORMANT with every reason. Claims a probe contradicted, and settings that
scale a test down (``HISPARSE_HAL_CACHE_OPS_SEQUENCES``), are printed as warnings and change nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

from .contracts import CONTRACTS
from .mustpass import file_sha256, read_mustpass, suite_digest
from .report import OUTCOMES, overall_verdict, skipped_capability

__all__ = ["Verification", "load_report", "verify_document", "verify_folder", "add_arguments", "run"]

VERDICTS = ("PASS", "PASS (partial)", "FAIL", "INCOMPLETE")
#: Skip kinds a must-pass test may have (an expected failure must come from the committed expectations file).
ALLOWED_SKIPS = ("capability", "not-applicable")
#: How many test ids one reason names before it says how many more there are.
LISTED = 5


class Verification:
    """The outcome of a check: the reasons the report is not conformant (none: conformant) and warnings."""

    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.warnings: list[str] = []

    @property
    def conformant(self) -> bool:
        """Whether no reason was found."""
        return not self.reasons

    def lines(self) -> list[str]:
        """What ``verify`` prints: the verdict, then one line per reason, then one per warning."""
        head = "CONFORMANT" if self.conformant else "NOT CONFORMANT"
        return [head, *(f"- {r}" for r in self.reasons), *(f"warning: {w}" for w in self.warnings)]


def load_report(folder: str | Path) -> dict[str, Any]:
    """The ``results.json`` document of a report folder.

    Raises:
        InvalidArgumentError: the folder has no ``results.json``, or it is not a JSON object.
    """
    path = Path(folder) / "results.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"{folder}: no readable results.json ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgumentError(f"{path}: not a conformance report (a JSON {type(doc).__name__}, not an object)")
    return doc


def _is(kind: type | tuple[type, ...], nullable: bool = False) -> Callable[[Any], bool]:
    """A check that a value has this type (a bool is no int), or is null when ``nullable``."""
    def check(value: Any) -> bool:
        if value is None:
            return nullable
        if isinstance(value, bool) and kind is not bool:
            return False
        return isinstance(value, kind)

    return check


_STR, _OPT_STR, _NUM = _is(str), _is(str, nullable=True), _is((int, float))
#: The format-2 keys verify needs, as ``path: check`` (a dotted path into the document).
SCHEMA: dict[str, Callable[[Any], bool]] = {
    "format": lambda v: v == 2, "verdict": lambda v: v in VERDICTS, "suite_version": _STR, "backend": _STR,
    "contract": _is(dict), "contract.id": _STR, "contract.title": _STR,
    "suite": _is(dict), "suite.version": _STR, "suite.sha256": _STR, "suite.files": _is(list),
    "mode": lambda v: v in ("full", "subset"),
    "backend_under_test": _is(dict), "backend_under_test.kind": lambda v: v in ("registry", "factory", "vllm-class"),
    "backend_under_test.label": _STR, "backend_under_test.qualname": _OPT_STR, "backend_under_test.build": _is(dict),
    "run": _is(dict), "run.started": _STR, "run.finished": _OPT_STR, "run.hisparse_hal_version": _OPT_STR,
    "run.commit": _OPT_STR, "run.host": _STR, "run.device": _is(dict), "run.device.type": _STR,
    "run.device.name": _OPT_STR, "run.device.driver": _OPT_STR, "run.python": _STR, "run.torch": _STR,
    "claims": _is(list), "summary": _is(dict), "tests": _is(list), "facts": _is(dict),
    "expectations": _is(dict), "expectations.sha256": _OPT_STR, "expectations.committed": _is(bool),
    "selection": _is(dict), "selection.full_suite": _is(bool),
}
_MISSING = object()


def _at(doc: Mapping[str, Any], dotted: str) -> Any:
    value: Any = doc
    for key in dotted.split("."):
        if not isinstance(value, Mapping) or key not in value:
            return _MISSING
        value = value[key]
    return value


def _schema_reasons(doc: Mapping[str, Any]) -> list[str]:
    reasons = []
    for dotted, check in SCHEMA.items():
        value = _at(doc, dotted)
        if value is _MISSING:
            parent = dotted.rpartition(".")[0]
            if not parent or _at(doc, parent) is not _MISSING:  # report the first missing level only
                reasons.append(f"schema: {dotted} is missing")
        elif not check(value):
            reasons.append(f"schema: {dotted} has a wrong value or type: {json.dumps(value, default=str)[:80]}")
    tests = doc.get("tests")
    for n, test in enumerate(tests if isinstance(tests, list) else []):
        if not (isinstance(test, Mapping) and isinstance(test.get("id"), str) and test.get("outcome") in OUTCOMES
                and isinstance(test.get("reason"), str) and "skip_kind" in test):
            reasons.append(f"schema: tests[{n}] lacks id, outcome, reason or skip_kind: {str(test)[:120]}")
    return reasons


def _listed(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:LISTED])
    return shown + (f", and {len(ids) - LISTED} more" if len(ids) > LISTED else "")


def _installed_vendor_expectations(doc: Mapping[str, Any]) -> str | None:
    """The vendor expectations file installed here for the report's backend class (else its recorded file)."""
    qualname = (doc.get("backend_under_test") or {}).get("qualname")
    if qualname and ":" in qualname:
        try:
            from .qualnames import load_factory
            from .resolved_run import expectations_for_class

            return expectations_for_class(load_factory(qualname))
        except Exception:  # noqa: BLE001 - a class that does not import here: fall back to the recorded file
            pass
    recorded = (doc.get("expectations") or {}).get("vendor_file")
    return recorded if isinstance(recorded, str) and Path(recorded).is_file() else None


def _expectations_reasons(doc: Mapping[str, Any]) -> list[str]:
    record = doc.get("expectations") or {}
    used = record.get("file")
    if not used:
        return []
    vendor = _installed_vendor_expectations(doc)
    if vendor is None:
        return [f"expectations: the run used {used}, and no vendor expectations file is installed here for "
                f"{(doc.get('backend_under_test') or {}).get('qualname')}"]
    installed = file_sha256(vendor)
    if record.get("sha256") != installed:
        return [f"expectations: the file the run used ({used}, sha256 {str(record.get('sha256'))[:12]}) is not the "
                f"vendor's committed file ({vendor}, sha256 {installed[:12]}): edited or replaced"]
    return []


def _claimed_anyway(test: Mapping[str, Any], capabilities: Mapping[str, Any]) -> str | None:
    """The recorded capability value that contradicts a capability skip (None: the record agrees, or has none).

    A skip for a missing capability is allowed only when the report's own ``facts.capabilities`` denies it: a flag
    recorded true (``backend capability ipc_events is False`` beside ``ipc_events: true``), or a KV format the skip
    says is missing but the recorded ``kv_formats`` lists, is a report edited or produced inconsistently.
    """
    name = skipped_capability(str(test.get("reason", "")))
    if name is None or name not in capabilities:
        return None
    value = capabilities[name]
    if value is True:
        return f"{name} is true"
    lacks = str(test.get("reason", "")).partition(" lacks ")[2].split(maxsplit=1)
    if isinstance(value, list) and lacks and lacks[0] in value:
        return f"{name} lists {lacks[0]}"
    return None


def _outcome_reason(test: Mapping[str, Any], expectations_ok: bool,
                    capabilities: Mapping[str, Any] | None = None) -> str | None:
    """Why this must-pass test's outcome is not allowed (None: it is)."""
    outcome, kind = test["outcome"], test.get("skip_kind")
    why = " ".join(str(test.get("reason", "")).split())[:200]
    if outcome == "passed":
        return None
    if outcome == "skipped" and kind == "capability":
        contradiction = _claimed_anyway(test, capabilities or {})
        if contradiction:
            return (f"{test['id']} skipped for a missing capability, but the report's capabilities say "
                    f"{contradiction}: {why}")
        return None
    if outcome == "skipped" and kind in ALLOWED_SKIPS:
        return None
    if outcome == "xfailed" and kind == "expectation" and expectations_ok:
        return None
    if outcome in ("failed", "xpassed"):
        return f"{test['id']} {outcome}: {why}"
    if outcome == "xfailed":
        return f"{test['id']} xfailed, not from the vendor's committed expectations file: {why}"
    return f"{test['id']} skipped ({kind}), not for a named missing capability: {why}"


def _must_pass_reasons(doc: Mapping[str, Any], expectations_ok: bool) -> list[str]:
    contract_id = (doc.get("contract") or {}).get("id")
    if contract_id not in CONTRACTS:
        return [f"contract: {contract_id!r} is not a contract of this suite (known: {sorted(CONTRACTS)})"]
    must = read_mustpass(CONTRACTS[contract_id])
    tests = {t["id"]: t for t in doc["tests"]}
    missing = [i for i in must if i not in tests]
    reasons = []
    if missing:
        reasons.append(f"must-pass: {len(missing)} of {len(must)} tests of {contract_id} are missing from the "
                       f"report: {_listed(missing)}")
    recorded = doc["facts"].get("capabilities")
    capabilities = recorded if isinstance(recorded, Mapping) else {}
    reasons += [r for i in must if i in tests and (r := _outcome_reason(tests[i], expectations_ok, capabilities))]
    return reasons


def _run_reasons(doc: Mapping[str, Any]) -> list[str]:
    reasons = []
    installed = suite_digest()
    suite = doc["suite"]
    if suite["version"] != installed["version"]:
        reasons.append(f"suite: the report is of suite version {suite['version']}, the installed suite is "
                       f"{installed['version']}")
    if suite["sha256"] != installed["sha256"]:
        reasons.append(f"suite: the report's suite hash {suite['sha256'][:12]} is not the installed suite's "
                       f"{installed['sha256'][:12]} (a different or modified suite)")
    if doc.get("incomplete"):
        why = (doc["incomplete"] or {}).get("reason") if isinstance(doc["incomplete"], Mapping) else None
        reasons.append(f"incomplete: the run did not finish ({why or 'marked incomplete'})")
    mismatch = doc.get("device_mismatch")
    if mismatch:
        why = mismatch.get("reason") if isinstance(mismatch, Mapping) else None
        reasons.append(f"devices: {why or 'the test processes tested different backends or devices'}")
    if doc["mode"] != "full" or not doc["selection"].get("full_suite"):
        selection = doc["selection"]
        named = ", ".join(f"{k} {selection[k]!r}" for k in ("subset", "keyword", "markexpr", "pytest_args")
                          if selection.get(k))
        reasons.append(f"mode: a subset of the suite ran ({named or 'a selection'}), not the full suite")
    tests = doc["tests"]
    recomputed = overall_verdict({**doc, "summary": {o: sum(1 for t in tests if t["outcome"] == o) for o in OUTCOMES}})
    if doc["verdict"] != "PASS" or recomputed != "PASS":
        reasons.append(f"verdict: {doc['verdict']}" + (f" (its tests say {recomputed})"
                                                       if recomputed != doc["verdict"] else "") + ", not PASS")
    return reasons


#: Settings that change how much a test checks without changing the suite's files, its hash or its test ids.
SCALE_SETTINGS = ("HISPARSE_HAL_CACHE_OPS_SEQUENCES",)


def _setting_warnings(doc: Mapping[str, Any]) -> list[str]:
    """A warning for each setting the run changed that scales a test (a smaller run of the same tests is still
    the full suite by its hash and ids, so it stays conformant, but says so)."""
    facts = doc.get("facts")
    env = facts.get("env") if isinstance(facts, Mapping) else None
    if not isinstance(env, Mapping):
        return []
    return [f"setting: the run set {name}={env[name]} (the cache_ops tier ran that many generated sequences, "
            "not its default)" for name in SCALE_SETTINGS if name in env]


def verify_document(doc: Mapping[str, Any]) -> Verification:
    """Check one ``results.json`` document against the installed suite (see the module's invariant)."""
    result = Verification()
    result.reasons += _schema_reasons(doc)
    if result.reasons:
        return result  # the other checks read what the schema guarantees
    result.reasons += _run_reasons(doc)
    expectation_reasons = _expectations_reasons(doc)
    result.reasons += expectation_reasons
    result.reasons += _must_pass_reasons(doc, not expectation_reasons)
    result.warnings += _setting_warnings(doc)
    for claim in doc["claims"]:
        if isinstance(claim, Mapping):
            result.warnings.append(f"claim: the backend denies {claim.get('capability')}, but a probe found it "
                                   f"working: {claim.get('evidence')}")
    return result


def verify_folder(folder: str | Path) -> Verification:
    """:func:`verify_document` of a report folder's ``results.json``.

    Raises:
        InvalidArgumentError: the folder has no readable JSON ``results.json``.
    """
    return verify_document(load_report(folder))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` arguments to ``parser``."""
    parser.add_argument("report", metavar="REPORT_DIR", help="a report folder written by 'conformance --report'")


def run(args: argparse.Namespace) -> int:
    """Print CONFORMANT or NOT CONFORMANT with every reason; 0 conformant, 1 not (2: no readable report, raised)."""
    result = verify_folder(args.report)
    for line in result.lines():
        print(line)
    return 0 if result.conformant else 1
