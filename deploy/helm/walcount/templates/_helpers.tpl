{{/* The chart's full name: the release name, with "-walcount" unless it says walcount already. */}}
{{- define "walcount.fullname" -}}
{{- if contains "walcount" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-walcount" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "walcount.selectorLabels" -}}
app.kubernetes.io/name: walcount
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "walcount.labels" -}}
{{ include "walcount.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "walcount.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The variables every walcount container gets: the URLs from Secrets, the
config file, the listen address. Call with (dict "root" $ "databaseURL" <secret ref>). */}}
{{- define "walcount.env" -}}
{{- $root := .root -}}
{{- $full := include "walcount.fullname" $root -}}
- name: WALCOUNT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .databaseURL.secretName | default $full }}
      key: {{ .databaseURL.secretKey }}
- name: WALCOUNT_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.redisURL.secretName | default $full }}
      key: {{ $root.Values.redisURL.secretKey }}
{{- if $root.Values.httpToken.secretName }}
- name: WALCOUNT_HTTP_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.httpToken.secretName }}
      key: {{ $root.Values.httpToken.secretKey }}
{{- end }}
- name: WALCOUNT_HTTP_ADDR
  value: "0.0.0.0:{{ $root.Values.service.port }}"
- name: WALCOUNT_LOG_FORMAT
  value: json
{{- if $root.Values.config }}
- name: WALCOUNT_CONFIG
  value: /etc/walcount/walcount.yaml
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "walcount.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "walcount.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
