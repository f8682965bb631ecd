"""Every shipped example, and model-name patterns, as the real kube-apiserver judges them with the
generated CRD (its schema and CEL rules): what users apply is admitted, a malformed pattern is not."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from operator_fixtures import CRD_PATH, EXAMPLES, Fleets, fleets_fixture, load_example

from support.controlplane import ApplyCrd

pytestmark = pytest.mark.integration

fleets = fleets_fixture()


@pytest.mark.parametrize("example", sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
def test_every_example_is_admitted_as_written(
    fleets: Fleets, apply_crd: ApplyCrd, example: str
) -> None:
    apply_crd(CRD_PATH)
    body = load_example(example)
    created = fleets.create(body)
    assert created["spec"]["model"] == {**created["spec"]["model"], **body["spec"]["model"]}
    fleets.delete(created["metadata"]["name"])


def _with_aliases(aliases: list[str]) -> dict[str, Any]:
    body = load_example("agents", name="aliases")
    body["spec"]["model"]["aliases"] = aliases
    return body


def test_alias_patterns_are_admitted(fleets: Fleets, apply_crd: ApplyCrd) -> None:
    apply_crd(CRD_PATH)
    aliases = ["claude-*", "gpt-*-sol", "*-codex", "claude-sonnet-4-5[1m]", "*"]
    created = fleets.create(_with_aliases(aliases))
    assert created["spec"]["model"]["aliases"] == aliases


@pytest.mark.parametrize("alias", ["claude-?", "-claude-*", "claude *", "claude-[a-z]+"])
def test_malformed_alias_patterns_are_rejected_at_admission(
    fleets: Fleets, apply_crd: ApplyCrd, alias: str
) -> None:
    """Only '*' is a wildcard; '?', spaces, '+' are no part of a model name or a pattern."""
    apply_crd(CRD_PATH)
    with pytest.raises(ApiException) as err:
        fleets.create(_with_aliases([alias]))
    assert err.value.status == 422
    assert "spec.model.aliases[0]" in str(err.value.body) and "should match" in str(err.value.body)
