{{/*
Name helpers. The operator's own objects use app.kubernetes.io/name=kvretention-operator so they can
never be selected by the labels the operator puts on a fleet (app.kubernetes.io/name=kvretention).
*/}}
{{- define "kvretention.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvretention.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 54 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 54 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator Deployment, Service, Roles and (by default) ServiceAccount. */}}
{{- define "kvretention.operatorName" -}}
{{- printf "%s-operator" (include "kvretention.fullname" .) }}
{{- end }}

{{- define "kvretention.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvretention.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kvretention.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvretention.name" . }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvretention.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvretention.selectorLabels" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: kvretention
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "kvretention.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The namespaces the operator watches when it is not cluster-wide (default: the release namespace). */}}
{{- define "kvretention.watchNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- join "," (uniq .Values.watch.namespaces) }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs to reconcile KvRetentionDeployments, exactly what it uses: its own
objects and their status, the children it server-side-applies, probe reports from worker pods,
whether the auth Secrets a fleet names exist (get, read as metadata only), and events. The Lease
for leader election is granted separately, in the release namespace only.
*/}}
{{- define "kvretention.reconcileRules" -}}
- apiGroups: ["kvretention.io"]
  resources: ["kvretentiondeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kvretention.io"]
  resources: ["kvretentiondeployments/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Whether each auth Secret a fleet names exists, and the fleet's hop key made when absent (a
# metadata-only read and a create; never listed, watched, updated or read whole).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Multinode worker pools (workers.nodesPerReplica > 1); harmless where the LWS CRD is absent.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# A fleet's InferencePool (spec.gateway.inferencePool); harmless where its CRD is absent.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
{{- end }}
