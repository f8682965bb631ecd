#!/usr/bin/env bash
# Copy the generated CRDs (crds/*.yaml, the single source of truth, generated from
# kvretention.api) into the Helm chart as templates under charts/kvretention/templates/crds/.
# They are templates, not the chart's crds/ folder, so `helm upgrade` upgrades them; the template
# adds `crds.enabled` and, with `crds.keep`, `helm.sh/resource-policy: keep`.
#
# Usage: scripts/sync-chart-crds.sh          # rewrite the chart's copies
#        scripts/sync-chart-crds.sh --check  # exit 1 and name the files when they drifted
# Env:   PYTHON (default .venv/bin/python), KVR_CRDS_DIR (default crds/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$py" ]] || py=python3
exec "$py" - "$root" "${KVR_CRDS_DIR:-$root/crds}" "${1:-}" <<'PY'
import sys
from pathlib import Path

import yaml

root, src_dir, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
out_dir = root / "charts" / "kvretention" / "templates" / "crds"
if mode not in ("", "--check"):
    sys.exit(f"usage: {sys.argv[0]} [--check]")


def render(src: Path) -> str:
    crd = yaml.safe_load(src.read_text())
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        sys.exit(f"{src}: not a CustomResourceDefinition")
    meta = crd.get("metadata") or {}
    spec = yaml.safe_dump(
        {"spec": crd["spec"]}, sort_keys=False, width=1 << 16, allow_unicode=True
    )
    if "{{" in spec or "}}" in spec:
        sys.exit(f"{src}: '{{{{' or '}}}}' in the CRD would be read as a Helm template")
    extra_ann = yaml.safe_dump(meta.get("annotations") or {}, sort_keys=True).strip()
    extra_lab = yaml.safe_dump(meta.get("labels") or {}, sort_keys=True).strip()
    ann = [] if extra_ann == "{}" else ["    " + ln for ln in extra_ann.splitlines()]
    lab = [] if extra_lab == "{}" else ["    " + ln for ln in extra_lab.splitlines()]
    head = [
        f"{{{{- /* Generated from crds/{src.name} by scripts/sync-chart-crds.sh; do not edit. */}}}}",
        "{{- if .Values.crds.enabled }}",
        f"apiVersion: {crd['apiVersion']}",
        f"kind: {crd['kind']}",
        "metadata:",
        f"  name: {meta['name']}",
    ]
    if ann:
        head += ["  annotations:", "    {{- if .Values.crds.keep }}",
                 "    helm.sh/resource-policy: keep", "    {{- end }}", *ann]
    else:
        head += ["  {{- if .Values.crds.keep }}", "  annotations:",
                 "    helm.sh/resource-policy: keep", "  {{- end }}"]
    # The CRD's own labels win; Helm's bookkeeping labels fill in the rest.
    helm_labels = {
        "helm.sh/chart": '{{ printf "%s-%s" .Chart.Name .Chart.Version }}',
        "app.kubernetes.io/instance": "{{ .Release.Name }}",
        "app.kubernetes.io/managed-by": "{{ .Release.Service }}",
        "app.kubernetes.io/part-of": "kvretention",
        "app.kubernetes.io/version": "{{ .Chart.AppVersion | quote }}",
    }
    own = meta.get("labels") or {}
    lab += [f"    {k}: {v}" for k, v in helm_labels.items() if k not in own]
    head += ["  labels:", *lab]
    return "\n".join(head) + "\n" + spec + "{{- end }}\n"


sources = sorted(src_dir.glob("*.yaml"))
if not sources:
    sys.exit(f"no CRDs in {src_dir}")
wanted = {out_dir / src.name: render(src) for src in sources}
stale = [p for p in sorted(out_dir.glob("*.yaml")) if p not in wanted]
drift = [p for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
if mode == "--check":
    if drift or stale:
        for p in drift + stale:
            print(f"drifted: {p.relative_to(root)}", file=sys.stderr)
        print("run scripts/sync-chart-crds.sh", file=sys.stderr)
        sys.exit(1)
    sys.exit(0)
out_dir.mkdir(parents=True, exist_ok=True)
for p in stale:
    p.unlink()
for p, text in wanted.items():
    p.write_text(text)
    print(f"wrote {p.relative_to(root)}", file=sys.stderr)
PY
