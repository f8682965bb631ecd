"""The README's first screen stays true: its two commands are make targets, its example fleet is a
valid ``KvRetentionDeployment`` the operator renders, and it stays short enough to read."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kvretention.controller.render import parse_cr
from kvretention.controller.resources import build_children

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAX_LINES = 120


def test_the_readme_opens_with_the_demo_and_the_test_command() -> None:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    targets = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert {"demo", "test"} <= targets
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_fleet_is_a_valid_resource_the_operator_renders() -> None:
    section = README.split("## A fleet", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    cr = parse_cr(yaml.safe_load(block.group(1)), source="README.md", namespace="default")
    kinds = {m["kind"] for m in build_children(cr)}
    assert {"Deployment", "Service"} <= kinds


def test_the_readme_reads_in_two_minutes() -> None:
    assert len(README.splitlines()) <= MAX_LINES
