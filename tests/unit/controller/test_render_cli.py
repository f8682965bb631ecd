"""``kvretention render``: manifests on stdout, or a readable error on stderr and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kvretention.cli import main

ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).parent / "cases"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["render", *args])
    return result.exit_code, result.stdout, result.stderr


def test_renders_multiple_files_in_order() -> None:
    code, out, err = run(
        "-f",
        str(ROOT / "examples/aggregated.yaml"),
        "-f",
        str(ROOT / "examples/disaggregated.yaml"),
    )
    assert (code, err) == (0, "")
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out)]
    assert names[0] == "qwen-mooncake-config"
    assert names[-1] == "qwen-pd-frontend"
    assert names.index("qwen-frontend") < names.index("qwen-pd-mooncake-config")


def test_namespace_flag_fills_missing_namespace() -> None:
    code, out, _ = run("-f", str(ROOT / "examples/aggregated.yaml"), "-n", "prod")
    assert code == 0
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(out)} == {"prod"}
    code, out, _ = run("-f", str(CASES / "hints-required.yaml"), "-n", "prod")
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(out)} == {"team-a"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a: [", "not valid YAML"),
        ("- 1\n", "document 1 is not a mapping"),
        (
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
            "expected apiVersion kvretention.io/v1alpha1 kind KvRetentionDeployment",
        ),
        ("", "no KvRetentionDeployment found"),
        (
            "apiVersion: kvretention.io/v1alpha1\nkind: KvRetentionDeployment\nmetadata: {name: x}\nspec: {}\n",
            "spec.model: Field required",
        ),
        ((CASES / "invalid-check-spec.yaml").read_text(), "can never work (InvalidSpec)"),
        (
            "apiVersion: kvretention.io/v1alpha1\nkind: KvRetentionDeployment\nmetadata: [1]\n",
            "metadata must be a mapping",
        ),
        # Types as strict as the API server's: quoted numbers and booleans are refused.
        *(
            (
                "apiVersion: kvretention.io/v1alpha1\nkind: KvRetentionDeployment\n"
                f"metadata: {{name: x}}\nspec: {{model: {{name: m, path: p}}, {field}}}\n",
                expected,
            )
            for field, expected in (
                (
                    'workers: {replicas: "2"}',
                    "spec.workers.replicas: Input should be a valid integer",
                ),
                (
                    'workers: {aggregated: {tensorParallelSize: "2"}}',
                    "spec.workers.aggregated.tensorParallelSize: Input should be a valid integer",
                ),
                (
                    'hints: {providers: {openai: "false"}}',
                    "spec.hints.providers.openai: Input should be a valid boolean",
                ),
            )
        ),
        (
            "apiVersion: kvretention.io/v1alpha1\nkind: KvRetentionDeployment\nmetadata: {name: x}\n"
            "spec: {model: {name: m, path: p}, workers: {aggregated: {extraArgs: [--tp-siz, '4']}}}\n",
            "--tp-siz (SGLang reads it as --tp-size) is set by the operator",
        ),
    ],
)
def test_bad_input_exits_2_without_traceback(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "cr.yaml"
    path.write_text(content)
    code, out, err = run("-f", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and expected in err
    assert "Traceback" not in err


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = run("-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err
