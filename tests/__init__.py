"""hisparse-hal's own tests, one folder per room of the package (see docs/design/architecture.md).

Test doubles vendors can reuse (simulated vendor runtimes, broken backends, bad-input generators) are shipped in
:mod:`hisparse_hal.testing`; helpers only these tests use sit beside the tests that use them.
"""

from pathlib import Path

#: The checkout's root.
REPO = Path(__file__).resolve().parent.parent
