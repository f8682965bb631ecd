"""Run SGLang's own HiCache Mooncake backend (``MooncakeStore``) against a master, on CPU.

Run as a subprocess by ``test_sglang_mooncake_backend.py``: SGLang's import chain is heavy (torch,
its model configs, quantization layers that warn on CPU), so it stays out of the pytest process.
The worker environment (``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH``, ``MOONCAKE_LOCAL_HOSTNAME``) comes
from the caller, exactly as the rendered worker Deployment sets it. Prints one JSON line.

Usage: python sglang_backend_check.py STANDIN_DIR PAGES PAGE_BYTES MASTER_METRICS_URL
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from hicache_store import load_cuda_standin, storage_config


def main() -> None:
    standin, pages, page_bytes = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    metrics_url = sys.argv[4]
    load_cuda_standin(standin)
    import torch
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    config = storage_config()
    store = MooncakeStore(config, None)  # loads the config file, sets up, warms up
    src = torch.arange(pages * page_bytes, dtype=torch.int64).remainder(251).to(torch.uint8)
    dst = torch.zeros_like(src)
    store.register_buffer(src)
    store.register_buffer(dst)
    keys = [f"kvr-l3-page-{i}" for i in range(pages)]
    base_src, base_dst = src.data_ptr(), dst.data_ptr()
    wrote = store.batch_set(
        keys,
        target_locations=[base_src + i * page_bytes for i in range(pages)],
        target_sizes=[page_bytes] * pages,
    )
    exists = [store.exists(k) for k in keys]
    read = [
        store.get(k, target_location=base_dst + i * page_bytes, target_sizes=page_bytes)
        for i, k in enumerate(keys)
    ]
    report = {
        "config": {
            "master_server_address": store.config.master_server_address,
            "metadata_server": store.config.metadata_server,
            "protocol": store.config.protocol,
            "device_name": store.config.device_name,
            "global_segment_size": store.config.global_segment_size,
            "master_metrics_port": store.config.master_metrics_port,
            "local_hostname": store.config.local_hostname,
        },
        "batch_set": bool(wrote),
        "exists": exists,
        "get": read,
        "equal": bool(torch.equal(src, dst)),
        # Read while this client's segment is still mounted (closing it unmounts the pages).
        "metrics": urllib.request.urlopen(metrics_url, timeout=5).read().decode(),
    }
    store.store.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
