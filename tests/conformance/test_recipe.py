"""Backend recipes: exactly one source, factories checked, vendor expectations found through the class hierarchy."""

from __future__ import annotations

import pytest

from hisparse_hal.conformance.qualnames import load_factory
from hisparse_hal.conformance.recipe import BackendRecipe, vendor_expectations_path
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.vendors.cpu.backend import CpuBackend


# ------------------------------------------------------------------------------------------ recipe and runner
def test_recipe_needs_exactly_one_source():
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        BackendRecipe()
    with pytest.raises(InvalidArgumentError, match="not both"):
        BackendRecipe.resolve("cpu", "m:f")
    assert BackendRecipe.resolve("cpu").registry_name == "cpu"
    assert BackendRecipe.resolve(None, "m:f").describe() == "m:f (factory)"


def test_factories_are_checked():
    assert load_factory("hisparse_hal.vendors.cpu.backend:CpuBackend") is CpuBackend
    for target, message in (
        ("nocolon", "package.module:callable"),
        ("os:path.nope", "no attribute"),
        ("os:sep", "not callable"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            load_factory(target)


class _Subclass(CpuBackend):
    """A backend defined outside any vendor package."""


def test_vendor_expectations_are_found_through_the_class_hierarchy():
    found = vendor_expectations_path(_Subclass)
    assert found is not None and found.parts[-2:] == ("cpu", "expectations.toml")
