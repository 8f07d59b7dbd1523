{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.labels" -}}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tandem.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tandem.modelCacheClaim" -}}
{{- .Values.modelCache.existingClaim | default (printf "%s-model-cache" (include "tandem.fullname" .)) -}}
{{- end -}}

{{/* Seconds Kubernetes waits after SIGTERM: the preStop sleep, the drain, then the shards stopping. */}}
{{- define "tandem.terminationGracePeriod" -}}
{{- add .Values.lifecycle.preStopSleepSeconds .Values.lifecycle.drainTimeoutSeconds .Values.lifecycle.extraGraceSeconds -}}
{{- end -}}

{{/* "true" when model.id is a Hugging Face repo id the init container fetches (not "", not a path, not offline). */}}
{{- define "tandem.downloadsModel" -}}
{{- $id := .Values.model.id -}}
{{- if and $id (not .Values.model.offline) (not (hasPrefix "/" $id)) (not (hasPrefix "." $id)) (not (hasPrefix "~" $id)) -}}
true
{{- end -}}
{{- end -}}

{{/* The model flags the init container's download and the launcher share. */}}
{{- define "tandem.modelArgs" -}}
{{- if .Values.model.revision }}
- --revision
- {{ .Values.model.revision | quote }}
{{- end }}
{{- if .Values.model.ggufFile }}
- --gguf-file
- {{ .Values.model.ggufFile | quote }}
{{- end }}
{{- if .Values.model.allowPickleWeights }}
- --allow-pickle-weights
{{- end }}
- --model-cache-dir
- "/data/tandem"
{{- end -}}

{{/* `tandem-launcher download`'s argv for the init container. */}}
{{- define "tandem.downloadArgs" -}}
- download
- {{ .Values.model.id | quote }}
{{- include "tandem.modelArgs" . }}
{{- end -}}

{{/* tandem-launcher's argv, one flag per line; charts/tests checks it against the launcher's own parser. */}}
{{- define "tandem.launcherArgs" -}}
{{- $limits := .Values.limits -}}
{{- if .Values.model.id }}
- --model-id
- {{ .Values.model.id | quote }}
{{- end }}
{{- include "tandem.modelArgs" . }}
- --num-shard
- {{ .Values.numShard | quote }}
- --device
- {{ .Values.device | quote }}
- --dtype
- {{ .Values.dtype | quote }}
- --kv-cache-dtype
- {{ .Values.kvCacheDtype | quote }}
- --hostname
- "0.0.0.0"
- --port
- {{ .Values.ports.http | quote }}
- --shard-metrics-port
- {{ .Values.ports.shardMetricsBase | quote }}
- --graceful-termination-timeout
- {{ .Values.lifecycle.drainTimeoutSeconds | quote }}
- --shard-start-timeout
- {{ .Values.lifecycle.startupTimeoutSeconds | quote }}
- --max-concurrent-requests
- {{ $limits.maxConcurrentRequests | quote }}
- --max-batch-prefill-tokens
- {{ $limits.maxBatchPrefillTokens | quote }}
- --max-batch-size
- {{ $limits.maxBatchSize | quote }}
{{- if $limits.maxInputTokens }}
- --max-input-tokens
- {{ $limits.maxInputTokens | quote }}
{{- end }}
{{- if $limits.maxTotalTokens }}
- --max-total-tokens
- {{ $limits.maxTotalTokens | quote }}
{{- end }}
{{- if $limits.kvCacheMemory }}
- --kv-cache-memory
- {{ $limits.kvCacheMemory | quote }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
