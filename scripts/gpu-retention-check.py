"""GPU check: a retained prefix survives cache pressure in a real SGLang engine, per SGLang itself.

Run on a machine with a GPU, sglang 0.5.23 (its GPU dependencies) and this package installed
(``pip install -e .`` registers the plugin's ``sglang.srt.plugins`` entry point), and the model on
local disk or in the Hugging Face cache:

    SGLANG_PLUGINS=kvretention python scripts/gpu-retention-check.py --model-path Qwen/Qwen2.5-0.5B-Instruct
    SGLANG_PLUGINS=kvretention python scripts/gpu-retention-check.py --model-path ... --hicache

It starts ``sglang.Engine`` with ``--radix-eviction-policy kvretain`` and a small KV pool, sends a
prompt with the ``kv.retain`` envelope the worker sends (``[0, prompt)``), a control prompt
without one, then unhinted prompts worth several pools, and sends both prompts again. What is
compared is SGLang's own ``meta_info["cached_tokens"]`` on the second pass: the retained prompt
must find at least 95% of its whole pages cached, the control (plain LRU would drop both) must
not. With ``--hicache`` the host tier is on too (cached tokens then count host hits). Prints one
JSON line; exit status 0 when the check holds, 1 when it does not.

Written for a GPU session; not run where this was written (no GPU was lent).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.sglang_radix import retain

RETAIN_SECONDS = 600


def prompt(rng: random.Random, n: int, vocab: int) -> list[int]:
    """``n`` random token ids: no two prompts share a prefix by chance."""
    return [rng.randrange(1000, vocab - 1000) for _ in range(n)]


def cached(engine: Any, ids: list[int], *, kv_hints: dict[str, Any] | None = None) -> int:
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        kv_hints=kv_hints,
    )
    return int(out["meta_info"]["cached_tokens"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-path", default="Qwen/Qwen2.5-0.5B-Instruct")
    parser.add_argument("--pool-tokens", type=int, default=16384, help="--max-total-tokens")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument(
        "--pressure", type=float, default=4.0, help="pools' worth of unhinted prompts"
    )
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--hicache", action="store_true", help="--enable-hierarchical-cache")
    args = parser.parse_args()
    os.environ.setdefault("SGLANG_PLUGINS", "kvretention")

    import sglang

    from kvretention.retention import EVICTION_POLICY
    from kvretention.retention.contract import check_targets

    problems = check_targets()
    if problems:
        print(json.dumps({"ok": False, "hook_targets": problems}))
        return 1
    extra = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0} if args.hicache else {}
    engine = sglang.Engine(
        model_path=args.model_path,
        radix_eviction_policy=EVICTION_POLICY,
        max_total_tokens=args.pool_tokens,
        page_size=args.page_size,
        mem_fraction_static=0.5,
        disable_cuda_graph=True,
        log_level="warning",
        **extra,
    )
    try:
        vocab = int(engine.tokenizer_manager.model_config.vocab_size)
        rng = random.Random(19)
        n = args.prompt_tokens
        retained, control = prompt(rng, n, vocab), prompt(rng, n, vocab)
        first = {
            "retained": cached(
                engine, retained, kv_hints=retain(n, duration=RETAIN_SECONDS, rid="retained")
            ),
            "control": cached(engine, control),
        }
        started = time.monotonic()
        pressure = int(args.pressure * args.pool_tokens) // n
        for _ in range(pressure):
            cached(engine, prompt(rng, n, vocab))
        # The second pass sends no hint: it reads what the tree kept, and changes no hold.
        again = {"retained": cached(engine, retained), "control": cached(engine, control)}
        whole = n // args.page_size * args.page_size
        share = {k: v / whole for k, v in again.items()}
        ok = share["retained"] >= 0.95 and share["control"] < 0.5
        print(
            json.dumps(
                {
                    "ok": ok,
                    "model": args.model_path,
                    "hicache": args.hicache,
                    "pool_tokens": args.pool_tokens,
                    "pressure_prompts": pressure,
                    "pressure_seconds": round(time.monotonic() - started, 1),
                    "first_pass_cached": first,
                    "second_pass_cached": again,
                    "second_pass_share": share,
                }
            )
        )
        return 0 if ok else 1
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
