{{/* The release's name for its objects, cut to what a label holds. */}}
{{- define "bucketserve.name" -}}
{{- printf "%s" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bucketserve.selector" -}}
app.kubernetes.io/name: bucketserve
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bucketserve.labels" -}}
{{ include "bucketserve.selector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
