{{- define "trainyard.labels" -}}
app.kubernetes.io/name: trainyard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "trainyard.selector" -}}
app.kubernetes.io/name: trainyard
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "trainyard.fullname" -}}
{{ .root.Release.Name }}-{{ .name }}
{{- end -}}
