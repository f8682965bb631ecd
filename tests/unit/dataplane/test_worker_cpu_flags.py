"""Where the worker runs SGLang and the CPU engine's argv: pure decisions, as a table."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvretention.dataplane.worker.cpu.flags import (
    CpuEngineUnsupported,
    choose_device,
    plan_cpu_argv,
)

CPU = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--disable-overlap-schedule",
    "--sleep-on-idle",
]


@pytest.mark.parametrize(
    ("choice", "cuda", "device"),
    [
        ("auto", True, "cuda"),
        ("auto", False, "cpu"),
        ("cpu", True, "cpu"),
        ("cuda", False, "cuda"),  # an explicit GPU stays: SGLang then says why it cannot start
    ],
)
def test_choose_device(choice: str, cuda: bool, device: str) -> None:
    assert choose_device(choice, cuda_available=cuda) == device  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "kept", "dropped"),
    [
        (["--model-path", "m"], ["--model-path", "m", *CPU], []),
        (
            ["--model-path", "m", "--enable-hierarchical-cache", "--hicache-ratio", "2.0"],
            ["--model-path", "m", *CPU],
            ["--enable-hierarchical-cache", "--hicache-ratio", "2.0"],
        ),
        (
            ["--hicache-storage-backend=mooncake", "--page-size", "16"],
            ["--page-size", "16", *CPU],
            ["--hicache-storage-backend=mooncake"],
        ),
        (
            ["--attention-backend", "sdpa", "--device=cpu"],
            [
                "--attention-backend",
                "sdpa",
                "--device=cpu",
                "--disable-overlap-schedule",
                "--sleep-on-idle",
            ],
            [],
        ),
        (["--tp-size", "1"], ["--tp-size", "1", *CPU], []),
    ],
    ids=["plain", "hicache-dropped", "hicache-equals-form", "user-flags-win", "one-rank"],
)
def test_plan_cpu_argv(argv: list[str], kept: list[str], dropped: list[str]) -> None:
    plan = plan_cpu_argv(argv)
    assert (plan.argv, plan.dropped) == (kept, dropped)


@pytest.mark.parametrize(
    "argv", [["--tp-size", "2"], ["--tp=2"], ["--pp-size", "2"], ["--dp-size", "4"]]
)
def test_more_than_one_rank_is_refused_with_the_reason(argv: list[str]) -> None:
    with pytest.raises(CpuEngineUnsupported, match="sgl-kernel"):
        plan_cpu_argv(argv)


def test_the_tiny_model_is_readable_by_the_user_that_serves_it(tmp_path: Path) -> None:
    """Images build it as root; the worker runs as uid 1000."""
    from kvretention.dataplane.worker.cpu.tiny_model import is_built, save

    directory = save(tmp_path / "tiny")
    assert is_built(directory)
    assert (directory / "model.safetensors").is_file()
    for path in [directory, *directory.iterdir()]:
        assert path.stat().st_mode & 0o004, f"{path.name} is not world-readable"
