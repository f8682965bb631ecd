"""``kvretention frontend``: the router or its own placement, exactly one, and refused before serving."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvretention.dataplane.frontend.cli import frontend_cmd
from kvretention.dataplane.frontend.placing import PlacingClient, build_placing
from kvretention.dataplane.router.discovery import DiscoveryError, Source
from kvretention.dataplane.router.state import RouterState


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --router-url or --worker/--worker-dns (exactly one)"),
        (
            ["--router-url", "http://r:8001", "--worker", "http://w:8002"],
            "give --router-url or --worker/--worker-dns (exactly one)",
        ),
        (["--router-url", "http://r:8001", "--kv-residency"], "--kv-residency needs --worker"),
        (["--worker-dns", "no-port"], "host:port"),
    ],
    ids=["neither", "both", "residency-without-workers", "dns-without-port"],
)
def test_a_frontend_without_one_upstream_is_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(frontend_cmd, args, env={"KVR_ROUTER_URL": ""})
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_placing_takes_the_workers_and_the_frontends_timeout() -> None:
    placing = build_placing(
        ("http://w0:8002", "http://w1:8002"), (), kv_residency=True, timeout=2.5
    )
    assert isinstance(placing, PlacingClient)
    assert [s.role for s in placing.state.sources] == ["aggregated"]
    config = placing.state.config
    assert (config.read_timeout_s, config.connect_timeout_s, config.kv_residency) == (
        2.5,
        2.5,
        True,
    )
    assert build_placing((), (), kv_residency=False, timeout=1.0) is None


def test_placing_refuses_a_disaggregated_pool() -> None:
    with pytest.raises(DiscoveryError):
        build_placing((), ("bad",), kv_residency=False, timeout=1.0)
    state = RouterState(sources=[Source(role="prefill", static=("http://w:1",))])
    with pytest.raises(ValueError, match="aggregated workers only"):
        PlacingClient(state, timeout=1.0)
