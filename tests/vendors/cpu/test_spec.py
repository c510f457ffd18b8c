"""The CPU device's registry entry (``vendors/cpu/spec.py``): always available, reporting page locking."""

from __future__ import annotations

import hisparse_hal
from hisparse_hal.vendors.cpu.runtime import probe_page_lock

MLOCK_WORKS = probe_page_lock()[0]


def test_cpu_probe_reports_page_locking():
    result = next(r for r in hisparse_hal.probe_backends() if r.name == "cpu")
    assert result.available and "host memory" in result.reason
    assert result.facts["page_lock"] is MLOCK_WORKS and result.facts["memlock_limit"]
