"""The hop key's signature over a request's tenant: what verifies and why the rest is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvretention.common.hop_auth import (
    HEADER_TENANT_SIG,
    MAX_AGE_S,
    HopKeyError,
    HopKeyFile,
    HopKeys,
    HopRefusal,
    hop_refusal,
    parse_hop_keys,
    read_hop_keys,
    sign_tenant,
    signed_headers,
    verify_tenant,
)
from kvretention.common.tenancy import HEADER_TENANT

KEY = "k" * 32
OTHER = "o" * 32
NOW = 1_800_000_000.0
KEYS = parse_hop_keys(KEY)
SIG_A = sign_tenant(KEYS, "team-a", now=NOW)


def _flip(sig: str) -> str:
    last = "0" if sig[-1] != "0" else "1"
    return sig[:-1] + last


# (what, signature, tenant it is checked for, verifier's keys, verifier's clock, refusal)
CASES: list[tuple[str, str | None, str | None, HopKeys, float, HopRefusal | None]] = [
    ("its own tenant", SIG_A, "team-a", KEYS, NOW, None),
    ("signed a minute ago", SIG_A, "team-a", KEYS, NOW + MAX_AGE_S, None),
    ("the signer's clock a minute ahead", SIG_A, "team-a", KEYS, NOW - MAX_AGE_S, None),
    ("no tenant, signed as none", sign_tenant(KEYS, None, now=NOW), None, KEYS, NOW, None),
    ("no tenant reads as empty", sign_tenant(KEYS, None, now=NOW), "", KEYS, NOW, None),
    ("another tenant", SIG_A, "team-b", KEYS, NOW, HopRefusal.INVALID),
    (
        "a tenant added to an unsigned one",
        sign_tenant(KEYS, None, now=NOW),
        "team-a",
        KEYS,
        NOW,
        HopRefusal.INVALID,
    ),
    ("another key", SIG_A, "team-a", parse_hop_keys(OTHER), NOW, HopRefusal.INVALID),
    ("one digit changed", _flip(SIG_A), "team-a", KEYS, NOW, HopRefusal.INVALID),
    (
        "a time changed",
        SIG_A.replace(str(int(NOW)), str(int(NOW) + 1)),
        "team-a",
        KEYS,
        NOW,
        HopRefusal.INVALID,
    ),
    ("stale", SIG_A, "team-a", KEYS, NOW + MAX_AGE_S + 1, HopRefusal.STALE),
    ("from the future", SIG_A, "team-a", KEYS, NOW - MAX_AGE_S - 1, HopRefusal.STALE),
    ("missing", None, "team-a", KEYS, NOW, HopRefusal.MISSING),
    ("empty", "", "team-a", KEYS, NOW, HopRefusal.MISSING),
    ("garbage", "garbage", "team-a", KEYS, NOW, HopRefusal.MALFORMED),
    ("another version", "v2" + SIG_A[2:], "team-a", KEYS, NOW, HopRefusal.MALFORMED),
    (
        "upper-case hex",
        SIG_A.upper().replace("V1", "v1"),
        "team-a",
        KEYS,
        NOW,
        HopRefusal.MALFORMED,
    ),
    ("short digest", SIG_A[:-2], "team-a", KEYS, NOW, HopRefusal.MALFORMED),
    ("not ASCII", SIG_A[:-1] + "é", "team-a", KEYS, NOW, HopRefusal.MALFORMED),
    ("a signature with a tail", SIG_A + ".x", "team-a", KEYS, NOW, HopRefusal.MALFORMED),
]


@pytest.mark.parametrize(
    ("signature", "tenant", "keys", "now", "refusal"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_verify_tenant(
    signature: str | None, tenant: str | None, keys: HopKeys, now: float, refusal: HopRefusal | None
) -> None:
    assert verify_tenant(keys, tenant, signature, now=now) is refusal


def test_a_rotated_key_file_signs_with_its_first_key_and_accepts_every_one() -> None:
    old, rotated = parse_hop_keys(KEY), parse_hop_keys(f"{OTHER}\n{KEY}\n")
    assert verify_tenant(rotated, "t", sign_tenant(old, "t", now=NOW), now=NOW) is None
    signed = sign_tenant(rotated, "t", now=NOW)
    assert verify_tenant(parse_hop_keys(OTHER), "t", signed, now=NOW) is None
    assert verify_tenant(old, "t", signed, now=NOW) is HopRefusal.INVALID


# (key file text, the problem named, or None: the keys it holds)
FILES: list[tuple[str, str | None]] = [
    (f"{KEY}\n", None),
    (f"# the fleet's hop key\n\n  {KEY}  \n", None),
    ("", "holds no hop key"),
    ("# only a comment\n", "holds no hop key"),
    ("short\n", "line 1"),
    (f"{KEY}\nwith a space in it and long enough to pass\n", "line 2"),
]


@pytest.mark.parametrize(("text", "problem"), FILES)
def test_parse_hop_keys(text: str, problem: str | None) -> None:
    if problem is None:
        assert parse_hop_keys(text).keys == (KEY.encode(),)
        return
    with pytest.raises(HopKeyError, match=problem) as raised:
        parse_hop_keys(text)
    assert KEY not in str(raised.value)


def test_read_hop_keys_names_the_file_and_never_a_key(tmp_path: Path) -> None:
    path = tmp_path / "hop-key"
    path.write_text(KEY + "\n")
    assert read_hop_keys(path) == KEYS
    with pytest.raises(HopKeyError, match="cannot read"):
        read_hop_keys(tmp_path / "absent")


# (the hop's keys, the headers it got, refusal)
HEADERS: list[tuple[HopKeys | None, dict[str, str], HopRefusal | None]] = [
    (None, {HEADER_TENANT: "team-a"}, None),  # no hop key: nothing checked
    (KEYS, signed_headers(KEYS, "team-a", now=NOW), None),
    (KEYS, signed_headers(KEYS, None, now=NOW), None),
    (KEYS, {HEADER_TENANT: "team-a"}, HopRefusal.MISSING),
    (KEYS, {}, HopRefusal.MISSING),
    (KEYS, {HEADER_TENANT: "team-b", HEADER_TENANT_SIG: SIG_A}, HopRefusal.INVALID),
]


@pytest.mark.parametrize(("keys", "headers", "refusal"), HEADERS)
def test_hop_refusal(
    keys: HopKeys | None, headers: dict[str, str], refusal: HopRefusal | None
) -> None:
    assert hop_refusal(keys, headers, now=NOW) is refusal


def test_signed_headers_without_a_hop_key_name_the_tenant_alone() -> None:
    assert signed_headers(None, "team-a", now=NOW) == {HEADER_TENANT: "team-a"}
    assert signed_headers(None, None, now=NOW) == {}
    assert set(signed_headers(KEYS, None, now=NOW)) == {HEADER_TENANT_SIG}


def test_a_hop_key_file_is_re_read_after_its_interval_and_a_broken_one_keeps_the_keys(
    tmp_path: Path,
) -> None:
    path = tmp_path / "hop-key"
    path.write_text(KEY)
    clock = [0.0]
    hop = HopKeyFile(path, reload_s=5.0, clock=lambda: clock[0])
    path.write_text(f"{OTHER}\n{KEY}\n")  # a rotation begins
    assert hop.keys == KEYS  # not yet looked at again
    clock[0] = 5.0
    assert hop.keys.keys == (OTHER.encode(), KEY.encode())
    path.write_text("short\n")
    clock[0] = 10.0
    assert hop.keys.keys == (OTHER.encode(), KEY.encode())
    path.unlink()
    clock[0] = 15.0
    assert hop.keys.keys == (OTHER.encode(), KEY.encode())
