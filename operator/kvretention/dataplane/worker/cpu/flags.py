"""Where the worker runs SGLang (GPU or CPU) and the SGLang flags that follow: pure decisions.

SGLang 0.5.23 serves on a CPU without AMX with ``SGLANG_USE_CPU_ENGINE=1`` and ``--device cpu
--attention-backend torch_native --disable-overlap-schedule`` (torch-native attention turns CUDA
graphs off by itself). HiCache does not start there: its host pool registers pinned memory through
``torch.cuda.cudart()`` and its host transfer ops exist only for CUDA/HIP/XPU/NPU, so on CPU the
worker leaves the HiCache flags out, says so in its log and in ``/v1/engine``, and the Mooncake tier
stays covered by the store client and master tiers instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

Device = Literal["cuda", "cpu"]
DeviceChoice = Literal["auto", "cuda", "cpu"]

CPU_ENGINE_ENV: Final = "SGLANG_USE_CPU_ENGINE"
CPU_FLAGS: Final[tuple[tuple[str, str | None], ...]] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--disable-overlap-schedule", None),
    ("--sleep-on-idle", None),
)
"""SGLang flags a CPU engine needs, each added only when the argv does not already give it.
``--sleep-on-idle``: without it SGLang's scheduler polls its sockets in a busy loop and an idle
engine takes a whole core, the one the frontend, the router and the other engines on the node
need; with it the scheduler waits on them and wakes as a request arrives."""
HICACHE_FLAG_PREFIXES: Final = ("--enable-hierarchical-cache", "--hicache-")
HICACHE_UNAVAILABLE: Final = (
    "HiCache needs a GPU in SGLang 0.5.23 (its host pool pins memory through torch.cuda.cudart() "
    "and its host transfer ops exist only for CUDA/HIP/XPU/NPU)"
)


def choose_device(choice: DeviceChoice, *, cuda_available: bool) -> Device:
    """``auto`` is the GPU when torch sees one, else the CPU; an explicit choice stands."""
    if choice == "auto":
        return "cuda" if cuda_available else "cpu"
    return choice


@dataclass(frozen=True)
class CpuPlan:
    """The SGLang argv for a CPU engine and what was left out of it, with why."""

    argv: list[str]
    dropped: list[str]
    """HiCache flags (and their values) the CPU engine cannot start with."""


def _given(argv: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def _takes_value(argv: Sequence[str], i: int) -> bool:
    return "=" not in argv[i] and i + 1 < len(argv) and not argv[i + 1].startswith("--")


RANK_FLAGS: Final = (
    "--tp-size",
    "--tp",
    "--tensor-parallel-size",
    "--pp-size",
    "--dp-size",
    "--dp",
)


class CpuEngineUnsupported(ValueError):
    """The argv asks for something SGLang's CPU engine cannot do without sgl-kernel's CPU build."""


def _ranks(argv: Sequence[str]) -> int:
    ranks = 1
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag in RANK_FLAGS:
            if not value and i + 1 < len(argv):
                value = argv[i + 1]
            ranks *= int(value) if value.isdigit() else 1
    return ranks


def plan_cpu_argv(argv: Sequence[str]) -> CpuPlan:
    """``argv`` with the CPU flags filled in and the HiCache flags taken out.

    Flags the user gave win (an explicit ``--attention-backend`` stays). A HiCache flag's value is
    dropped with it; ``--enable-hierarchical-cache`` is a switch and takes none. More than one rank
    (tensor, pipeline or data parallel) is refused: SGLang's CPU all-reduce is an sgl-kernel op,
    and no CPU build of sgl-kernel is installable here.
    """
    ranks = _ranks(argv)
    if ranks > 1:
        raise CpuEngineUnsupported(
            f"{ranks} ranks (--tp-size/--pp-size/--dp-size): SGLang's CPU engine runs one rank "
            "without sgl-kernel's CPU build (its all-reduce is an sgl-kernel op); give a GPU or "
            "--tp-size 1"
        )
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(HICACHE_FLAG_PREFIXES):
            width = 2 if arg.startswith("--hicache-") and _takes_value(argv, i) else 1
            dropped += argv[i : i + width]
            i += width
            continue
        kept.append(arg)
        i += 1
    given = _given(kept)
    for flag, value in CPU_FLAGS:
        if flag not in given:
            kept += [flag] if value is None else [flag, value]
    return CpuPlan(argv=kept, dropped=dropped)
