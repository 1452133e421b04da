{{/* Names, labels and the image, shared by every template. */}}

{{- define "pyvgpu.fullname" -}}
{{- printf "%s-pyvgpu" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{- define "pyvgpu.labels" -}}
app.kubernetes.io/name: pyvgpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "pyvgpu.selector" -}}
app.kubernetes.io/name: pyvgpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
An image tag as text. A tag of digits only (20240101) reaches the templates as a number: from a values file
a float64, which %s would print as %!s(float64=2.0240101e+07) and toString as 2.0240101e+07; from --set an
int64. values.schema.json admits only strings and whole numbers, so a number is printed as the integer it is.
*/}}
{{- define "pyvgpu.tag" -}}
{{- if kindIs "float64" . -}}
{{- printf "%.0f" . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{- define "pyvgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "pyvgpu.tag" (default .Chart.AppVersion .Values.image.tag)) -}}
{{- end -}}

{{/* kube-scheduler's tag: scheduler.kubeScheduler.tag, else v<major>.<minor>.0 of the cluster Helm talks to
(with `helm template`, the one --kube-version names). */}}
{{- define "pyvgpu.kubeSchedulerImage" -}}
{{- $minor := regexReplaceAll "[^0-9]" .Capabilities.KubeVersion.Minor "" -}}
{{- $tag := default (printf "v%s.%s.0" .Capabilities.KubeVersion.Major $minor) .Values.scheduler.kubeScheduler.tag -}}
{{- printf "%s:%s" .Values.scheduler.kubeScheduler.image (include "pyvgpu.tag" $tag) -}}
{{- end -}}

{{- define "pyvgpu.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{- required "webhook.tls.mode secret needs webhook.tls.secretName: a kubernetes.io/tls Secret in the release namespace" .Values.webhook.tls.secretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "pyvgpu.fullname" .) -}}
{{- end -}}
{{- end -}}
