"""Run a ``kvretention`` subcommand on uvloop's event loop (an experiment, not a supported mode).

The request-path benchmark starts its ``frontend+router/uvloop`` target with this launcher from
``.venv-bench`` (which has uvloop and the same aiohttp/pydantic versions) with ``operator/`` on
``PYTHONPATH``: same code, same libraries, only the event loop differs.

    PYTHONPATH=operator .venv-bench/bin/python benchmarks/uvloop_launch.py router --worker URL
"""

from __future__ import annotations

import sys

import uvloop  # type: ignore[import-not-found]  # only in .venv-bench

from kvretention.cli import main

if __name__ == "__main__":
    uvloop.install()
    sys.argv[0] = "kvretention"
    main()
