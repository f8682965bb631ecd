#!/usr/bin/env python3
"""Stand in for the kubelet on kwok nodes: put the probe's report into each worker pod's status.

usage: inject_probe_report.py --kubeconfig KC --namespace NS --name FLEET --report-file F [--timeout S]

On a real node the worker pod's ``probe`` init container runs ``kvretention probe --report-only``
and the kubelet stores what it prints as the container's termination message, which the operator
reads. kwok nodes have no kubelet and run no container, so the demo runs the same probe on this
machine and writes its output there (``tests/support/probe_status.py`` does the patching, as in the
integration tests). Polls until every worker pod carries the report or the timeout passes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kubernetes import client, config

from support.probe_status import (
    inject_probe_reports,
    list_worker_pods,
    probe_message,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True, help="the KvRetentionDeployment")
    parser.add_argument("--report-file", required=True, help="what `kvretention probe` printed")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    message = Path(args.report_file).read_text().strip()
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=args.kubeconfig
    )
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + args.timeout
    try:
        while True:
            inject_probe_reports(core, args.namespace, args.name, message)
            pods = list_worker_pods(core, args.namespace, args.name)
            if pods and all(probe_message(p) == message for p in pods):
                for pod in pods:
                    print(
                        f"    {pod['metadata']['name']}: probe terminated (exit 0), report written"
                    )
                return 0
            if time.monotonic() > deadline:
                print(
                    f"timed out after {args.timeout:.0f}s writing the probe report", file=sys.stderr
                )
                return 1
            time.sleep(1.0)
    finally:
        api.close()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
