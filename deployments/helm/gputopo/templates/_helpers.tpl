{{/* Chart name, possibly overridden. */}}
{{- define "gputopo.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every namespaced object name. */}}
{{- define "gputopo.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "gputopo.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "gputopo.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gputopo
{{- end }}

{{/* Selector labels; pass (dict "ctx" $ "component" "controller"). */}}
{{- define "gputopo.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gputopo.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "gputopo.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "gputopo.pluginServiceAccountName" -}}
{{- if .Values.kubeletPlugin.serviceAccount.create }}
{{- default (printf "%s-kubelet-plugin" (include "gputopo.fullname" .)) .Values.kubeletPlugin.serviceAccount.name }}
{{- else }}
{{- required "kubeletPlugin.serviceAccount.name is required when kubeletPlugin.serviceAccount.create is false" .Values.kubeletPlugin.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gputopo.controllerServiceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (printf "%s-controller" (include "gputopo.fullname" .)) .Values.controller.serviceAccount.name }}
{{- else }}
{{- required "controller.serviceAccount.name is required when controller.serviceAccount.create is false" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The driver name: fixed by the binaries, used by the DeviceClass and the slice policy. */}}
{{- define "gputopo.driverName" -}}gpu.gputopo.dev{{- end }}

{{/* The label mapping ConfigMap: its name is fixed, so the CLI finds it in any namespace. */}}
{{- define "gputopo.labelMappingName" -}}gputopo-label-mapping{{- end }}

{{/* The flag pointing the plugin and the controller at the label mapping ConfigMap. */}}
{{- define "gputopo.labelMappingArg" -}}
--label-mapping={{ .Release.Namespace }}/{{ include "gputopo.labelMappingName" . }}
{{- end }}

{{/*
Checks the values that the schema cannot explain well; called from the
DaemonSet template.
*/}}
{{- define "gputopo.validate" -}}
{{- if and .Values.kubeletPlugin.enabled (eq .Values.backend "sim") }}
{{- if and .Values.sim.profile .Values.sim.nodeProfiles }}
{{- fail "backend=sim: set sim.profile (one profile everywhere) or sim.nodeProfiles (a profile per node label), not both" }}
{{- end }}
{{- if not (or .Values.sim.profile .Values.sim.nodeProfiles) }}
{{- fail "backend=sim needs sim.profile (e.g. dgx-h100) or sim.nodeProfiles (e.g. [dgx-h100, dgx1-v100])" }}
{{- end }}
{{- end }}
{{- if and .Values.controller.enabled (gt (int .Values.controller.replicas) 1) (not .Values.controller.leaderElection) }}
{{- fail "controller.replicas > 1 needs controller.leaderElection=true: replicas must never plan at the same time" }}
{{- end }}
{{- end }}
