"""Tenants in SGLang's own caches: the ``cache_salt`` the worker passes for a tenant keeps its
radix entries and its HiCache / Mooncake page keys apart from every other tenant's."""

from __future__ import annotations

import pytest

from kvretention.common.tenancy import cache_salt_for
from kvretention.retention import l3
from support.sglang_radix import RadixTree, TreeSpec

pytestmark = pytest.mark.retention

PAGE = 4
PROMPT = list(range(100, 132))  # eight pages

# (tenant sending PROMPT, tokens SGLang finds cached): the same tenant shares, others do not
RADIX: list[tuple[str | None, int]] = [
    ("team-a", 0),
    ("team-b", 0),  # the same prompt, another tenant: a separate entry
    ("team-a", len(PROMPT)),
    ("team-b", len(PROMPT)),
    (None, 0),  # auth off: the shared namespace sees neither
    (None, len(PROMPT)),
]


@pytest.mark.parametrize("kind", ["unified", "radix"])
def test_the_same_prompt_from_two_tenants_is_two_radix_entries(kind: str) -> None:
    tree = RadixTree(TreeSpec(kind=kind, policy="lru", page_size=PAGE, tokens=512))
    hits = []
    for tenant, _ in RADIX:
        salt = None if tenant is None else cache_salt_for(tenant)
        hits.append(tree.run(PROMPT, salt=salt))
    assert hits == [hit for _, hit in RADIX]


def test_each_tenant_has_its_own_storage_key_namespace() -> None:
    """The seed SGLang's HiCache chains page keys from (``storage_namespace_seed``), and so the
    keys the retention plugin pins, differ per tenant and repeat for the same tenant."""
    keys = {
        tenant: l3._hash_pages(
            PROMPT,
            l3.namespace_seed(None, None if tenant is None else cache_salt_for(tenant)),
            PAGE,
        )
        for tenant in ("team-a", "team-b", None)
    }
    assert all(len(k) == len(PROMPT) // PAGE for k in keys.values())
    assert len({key for ks in keys.values() for key in ks}) == 3 * len(PROMPT) // PAGE
    again = l3._hash_pages(PROMPT, l3.namespace_seed(None, cache_salt_for("team-a")), PAGE)
    assert again == keys["team-a"]
