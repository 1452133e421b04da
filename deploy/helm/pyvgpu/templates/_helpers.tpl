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

{{- define "pyvgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "pyvgpu.kubeSchedulerImage" -}}
{{- $minor := regexReplaceAll "[^0-9]" .Capabilities.KubeVersion.Minor "" -}}
{{- $tag := default (printf "v%s.%s.0" .Capabilities.KubeVersion.Major $minor) .Values.scheduler.kubeScheduler.tag -}}
{{- printf "%s:%s" .Values.scheduler.kubeScheduler.image $tag -}}
{{- end -}}

{{- define "pyvgpu.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "secret" -}}
{{- required "webhook.tls.mode secret needs webhook.tls.secretName: a kubernetes.io/tls Secret in the release namespace" .Values.webhook.tls.secretName -}}
{{- else -}}
{{- printf "%s-webhook-tls" (include "pyvgpu.fullname" .) -}}
{{- end -}}
{{- end -}}
