"""What both SGLang MooncakeStore checks (``sglang_backend_check.py``, ``sglang_retention_check.py``)
set up before they import SGLang: the CUDA stand-in libraries, then a single-rank HiCache config.

Run scripts find it beside them (a script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

# one process: rank 0 of 1 along every parallel axis SGLang's HiCache config names
SINGLE_RANK = {
    "tp_rank": 0,
    "tp_size": 1,
    "pp_rank": 0,
    "pp_size": 1,
    "attn_cp_rank": 0,
    "attn_cp_size": 1,
}


def load_cuda_standin(standin: Path) -> None:
    """Load the stand-in libcuda/libcudart globally so SGLang's CUDA imports resolve on CPU."""
    for name in ("libcuda.so.1", "libcudart.so.12"):
        ctypes.CDLL(str(standin / name), mode=ctypes.RTLD_GLOBAL)


def storage_config(**extra: Any) -> Any:
    """SGLang's ``HiCacheStorageConfig`` for one page-first, non-MLA rank of ``kvr/l3-model``."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        **SINGLE_RANK,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=True,
        model_name="kvr/l3-model",
        **extra,
    )
