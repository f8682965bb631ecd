"""SGLang's own radix caches on CPU, fed the way its scheduler feeds them.

A :class:`RadixTree` builds the cache SGLang 0.5.23 builds (``UnifiedRadixCache``, optionally with
HiCache's host tier) or the classic ``RadixCache``, over real CPU memory pools, and runs requests
through it as SGLang's scheduler does: ``match_prefix`` and lock the cached prefix, evict to make
room, allocate the rest, then ``release_kv_cache`` (which checkpoints the KV into the tree, where
the retention plugin's hook runs). Nothing here stands in for SGLang; only the GPU is absent.

Import it after :func:`load_sglang` (SGLang's modules warn on import without a GPU).
"""

from __future__ import annotations

import os
import warnings
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock


@dataclass
class FakeClock:
    """A wall clock moved by hand (put it at ``kvretention.retention.radix.clock``): holds expire
    without sleeps or timing."""

    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def load_sglang(plugins: str = "kvretention") -> None:
    """Import SGLang's radix caches quietly and run SGLang's plugin loader once, restricted to
    ``plugins`` (``SGLANG_PLUGINS``). The loader finds the plugin through its installed entry
    point, exactly as ``sglang serve`` does."""
    os.environ["SGLANG_PLUGINS"] = plugins
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang.srt.mem_cache.radix_cache
        import sglang.srt.mem_cache.unified_radix_cache  # noqa: F401
        from sglang.srt.plugins import load_plugins

        load_plugins()


@dataclass(frozen=True)
class TreeSpec:
    """Which cache and how big: ``kind`` ``unified`` (what 0.5.23 builds) or ``radix``."""

    kind: str = "unified"
    policy: str = "kvretain"
    page_size: int = 4
    tokens: int = 256
    max_requests: int = 8
    context: int = 2048
    hicache: bool = False
    tree_core: str | None = None
    """The unified cache's TreeCore (``python``/``rust``); None = SGLang's choice."""
    tp_group: Any = None
    """The tensor-parallel group the tree is mirrored over (``torch.distributed``), if any."""
    eagle: bool = False
    """EAGLE speculative decoding: the tree keys token pairs (bigrams)."""


class RadixTree:
    """One SGLang radix cache over CPU pools, and requests run through it."""

    def __init__(self, spec: TreeSpec) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        self.spec = spec
        server_args = ServerArgs(
            model_path="dummy",
            page_size=spec.page_size,
            radix_eviction_policy=spec.policy,
            enable_hierarchical_cache=spec.hicache,
            hicache_io_backend="direct",
            hicache_mem_layout="page_first_direct",
            hicache_write_policy="write_through",
        )
        set_global_server_args_for_scheduler(server_args)
        self.pool = ReqToTokenPool(
            size=spec.max_requests,
            max_context_len=spec.context,
            device="cpu",
            enable_memory_saver=False,
        )
        kv = MHATokenToKVPool(
            size=spec.tokens,
            page_size=spec.page_size,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        if spec.page_size == 1:
            self.allocator: Any = TokenToKVPoolAllocator(
                size=spec.tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
            )
        else:
            from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator

            self.allocator = PagedTokenToKVPoolAllocator(
                size=spec.tokens,
                page_size=spec.page_size,
                dtype=torch.bfloat16,
                device="cpu",
                kvcache=kv,
                need_sort=False,
            )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.pool,
            token_to_kv_pool_allocator=self.allocator,
            page_size=spec.page_size,
            eviction_policy=spec.policy,
            tree_components=(ComponentType.FULL,),
            tree_core_backend=spec.tree_core,
            tp_cache_group=spec.tp_group,
            is_eagle=spec.eagle,
        )
        if spec.kind == "radix":
            self.cache: Any = RadixCache(params)
        else:
            self.cache = UnifiedRadixCache(params)
            if spec.hicache:
                self._init_hicache(server_args, params)
        self._rid = 0

    def _init_hicache(self, server_args: Any, params: Any) -> None:
        """HiCache's host tier as ``--enable-hierarchical-cache`` builds it; host memory is not
        pinned (no CUDA here), as SGLang's own CPU fixtures do."""
        import atexit

        import sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler as assembler

        original = assembler.get_mha_host_pool_cls

        def unpinned(device_pool: Any) -> Any:
            cls = original(device_pool)
            return lambda *a, **k: cls(*a, **{**k, "pin_memory": False})

        with mock.patch.object(assembler, "get_mha_host_pool_cls", side_effect=unpinned):
            self.cache.init_hicache(server_args, params)
        atexit.unregister(self.cache.shutdown)
        self.cache.write_through_threshold = 1 << 30  # no D->H copies: they need a GPU stream

    # ---- requests -------------------------------------------------------------------------

    def key(self, tokens: Sequence[int], salt: str | None = None) -> Any:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return RadixKey(array("q", tokens), cache_salt=salt)

    def cached(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` the device tier holds (SGLang's ``device_prefix_len``)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        return int(
            self.cache.match_prefix(MatchPrefixParams(key=self.key(tokens))).device_prefix_len
        )

    def host_cached(self, tokens: Sequence[int]) -> int:
        """Tokens of ``tokens`` found on the host tier only (SGLang's ``host_hit_length``)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        return int(self.cache.match_prefix(MatchPrefixParams(key=self.key(tokens))).host_hit_length)

    def leaf(self, tokens: Sequence[int], salt: str | None = None) -> Any:
        """The tree node where ``tokens`` (page-aligned) end; matching splits a node there."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        key = self.key(tokens, salt)
        node = self.cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
        return self.cache.resolve_node_handle(node)

    def run(
        self,
        tokens: Sequence[int],
        *,
        output: Sequence[int] = (),
        kv_hints: Any = None,
        priority: int | None = None,
        salt: str | None = None,
    ) -> int:
        """Serve one request whose prompt is ``tokens`` and which generated ``output``; returns
        the prompt tokens it found cached (the prefix SGLang did not recompute)."""
        import torch
        from sglang.srt.managers.kv_hints import decode_kv_hints_envelope
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.sampling.sampling_params import SamplingParams

        self._rid += 1
        req = Req(
            rid=f"r{self._rid}",
            origin_input_text="",
            origin_input_ids=array("q", tokens),
            sampling_params=SamplingParams(temperature=0, max_new_tokens=max(1, len(output))),
            kv_hints=decode_kv_hints_envelope(kv_hints) if kv_hints else None,
            priority=priority,
            cache_salt=salt,
        )
        self.pool.alloc([req])
        req.output_ids = array("q", output)
        match = self.cache.match_prefix(MatchPrefixParams(key=self.key(tokens, salt)))
        hit = int(match.device_prefix_len)
        req.last_node = match.last_device_node
        req.lock = self.cache.lock(req.last_node)
        total = len(tokens) + len(output)
        need = total - hit
        page = self.spec.page_size
        alloc_need = -(-need // page) * page
        short = alloc_need - self.allocator.available_size()
        if short > 0:
            self.cache.evict(EvictParams(num_tokens=short))
        fresh = self.allocator.alloc(alloc_need)
        if fresh is None:
            raise MemoryError(f"{alloc_need} tokens do not fit after eviction")
        prefix = self.cache.path_device_indices(req.last_node)[:hit]
        row = torch.cat([prefix.to(torch.int64), fresh[:need].to(torch.int64)])
        # The unused tail of the last page stays with it: freeing the row's tail frees the page.
        self.pool.write((req.kv.req_pool_idx, slice(0, total)), row)
        req.kv.cache_protected_len = hit
        req.kv.kv_committed_len = req.kv.kv_allocated_len = total
        req.finished_reason = FINISH_LENGTH(length=len(output))
        release_kv_cache(req, self.cache, checkpoint=True)
        return hit


def retain_hints(
    directives: list[dict[str, Any]], *, scope: str | None = None, rid: str = "r"
) -> dict[str, Any]:
    """The ``kv.retain`` 1.0 envelope with ``directives`` (what the worker sends)."""
    return {
        "protocol_version": "0.1",
        "message_id": rid,
        "actions": [
            {
                "action_id": f"{rid}/kv.retain",
                "action_type": "kv.retain",
                "action_version": "1.0",
                "payload": {"scope": scope, "directives": directives},
            }
        ],
    }


def retain(
    end: int | None,
    *,
    start: int = 0,
    priority: int = 50,
    duration: int | None = 300,
    scope: str | None = None,
    rid: str = "r",
) -> dict[str, Any]:
    """One-directive envelope: keep ``[start, end)`` at ``priority`` for ``duration`` seconds."""
    return retain_hints(
        [{"start": start, "end": end, "priority": priority, "duration": duration}],
        scope=scope,
        rid=rid,
    )
