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

{{/* "true" when the string given is a Hugging Face repo id (not "", not a path). */}}
{{- define "tandem.isRepoId" -}}
{{- if and . (not (hasPrefix "/" .)) (not (hasPrefix "." .)) (not (hasPrefix "~" .)) -}}
true
{{- end -}}
{{- end -}}

{{/* The draft model when speculative decoding uses one, else "". */}}
{{- define "tandem.draftModel" -}}
{{- if gt (int .Values.speculative.speculate) 0 -}}
{{- .Values.speculative.model -}}
{{- end -}}
{{- end -}}

{{/* "true" when the init container fetches something: model.id or the draft model is a Hugging Face repo id, or
     LoRA adapters are given, and the install is not offline. */}}
{{- define "tandem.downloadsModel" -}}
{{- if and (not .Values.model.offline) (or (include "tandem.isRepoId" .Values.model.id) (include "tandem.isRepoId" (include "tandem.draftModel" .)) .Values.lora.adapters) -}}
true
{{- end -}}
{{- end -}}

{{/* The draft model flags the init container's download and the launcher share. */}}
{{- define "tandem.draftModelArgs" -}}
{{- with include "tandem.draftModel" . }}
- --speculative-model
- {{ . | quote }}
{{- end }}
{{- if and (include "tandem.draftModel" .) .Values.speculative.revision }}
- --speculative-model-revision
- {{ .Values.speculative.revision | quote }}
{{- end }}
{{- end -}}

{{/* Speculative decoding's launcher flags; none while speculate is 0. */}}
{{- define "tandem.speculativeArgs" -}}
{{- $speculative := .Values.speculative -}}
{{- if gt (int $speculative.speculate) 0 }}
- --speculate
- {{ $speculative.speculate | quote }}
- --speculative-disable-by-batch-size
- {{ $speculative.disableByBatchSize | quote }}
{{- if $speculative.method }}
- --speculative-method
- {{ $speculative.method | quote }}
{{- end }}
{{- include "tandem.draftModelArgs" . }}
{{- end }}
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
{{- if .Values.model.id }}
- {{ .Values.model.id | quote }}
{{- end }}
{{- include "tandem.modelArgs" . }}
{{- include "tandem.draftModelArgs" . }}
{{- include "tandem.loraAdapterArgs" . }}
{{- end -}}

{{/* The adapters flag the init container's download and the launcher share. */}}
{{- define "tandem.loraAdapterArgs" -}}
{{- if .Values.lora.adapters }}
- --lora-adapters
- {{ .Values.lora.adapters | quote }}
{{- end }}
{{- end -}}

{{/* The launcher's LoRA flags beyond the adapters; none by default, so the launcher's defaults hold. */}}
{{- define "tandem.loraArgs" -}}
{{- include "tandem.loraAdapterArgs" . }}
{{- if ne .Values.lora.maxLoras nil }}
- --max-loras
- {{ .Values.lora.maxLoras | quote }}
{{- end }}
{{- if ne (int .Values.lora.maxLoraRank) 64 }}
- --max-lora-rank
- {{ .Values.lora.maxLoraRank | quote }}
{{- end }}
{{- if ne .Values.lora.maxCpuLoras nil }}
- --max-cpu-loras
- {{ .Values.lora.maxCpuLoras | quote }}
{{- end }}
{{- if .Values.lora.runtimeUpdates }}
- --allow-runtime-lora-updating
{{- end }}
{{- end -}}

{{/* "true" when the chart renders a LeaderWorkerSet of multiNode.size pods per group instead of the Deployment. */}}
{{- define "tandem.multiNode" -}}
{{- if gt (int .Values.multiNode.size) 1 -}}
true
{{- end -}}
{{- end -}}

{{/* Ranks of the whole tensor-parallel group: numShard per pod times the pods of a group. */}}
{{- define "tandem.totalShards" -}}
{{- mul (int .Values.numShard) (max 1 (int .Values.multiNode.size)) -}}
{{- end -}}

{{/* Labels that select only the pods where the router runs: all pods, or the leader of each LeaderWorkerSet group. */}}
{{- define "tandem.servingSelectorLabels" -}}
{{ include "tandem.selectorLabels" . }}
{{- if include "tandem.multiNode" . }}
leaderworkerset.sigs.k8s.io/worker-index: "0"
{{- end }}
{{- end -}}

{{- define "tandem.clusterSecretName" -}}
{{- .Values.multiNode.clusterSecret.existingSecret | default (printf "%s-cluster" (include "tandem.fullname" .)) -}}
{{- end -}}

{{- define "tandem.clusterSecretPath" -}}
/etc/tandem/cluster/{{ .Values.multiNode.clusterSecret.key }}
{{- end -}}

{{/* tandem-launcher's argv, one flag per line; charts/tests checks it against the launcher's own parser.
     Called with (dict "root" $ "role" "single"|"leader"|"worker"). */}}
{{- define "tandem.launcherArgs" -}}
{{- $role := .role -}}
{{- with .root -}}
{{- $limits := .Values.limits -}}
{{- if .Values.model.id }}
- --model-id
- {{ .Values.model.id | quote }}
{{- end }}
{{- include "tandem.modelArgs" . }}
- --num-shard
- {{ include "tandem.totalShards" . | quote }}
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
{{- include "tandem.speculativeArgs" . }}
{{- include "tandem.loraArgs" . }}
{{- if include "tandem.multiNode" . }}
{{- include "tandem.multiNodeArgs" (dict "root" . "role" $role) }}
{{- end }}
{{- if and .Values.kvEvents.enabled (ne $role "worker") }}
{{- include "tandem.kvEventsArgs" . }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The group's shape; the master address and a worker's rank come from LWS_LEADER_ADDRESS and LWS_WORKER_INDEX,
     which LWS injects and the launcher reads when the flags are absent. The secret is a file, never on argv. */}}
{{- define "tandem.multiNodeArgs" -}}
{{- with .root }}
- --nnodes
- {{ .Values.multiNode.size | quote }}
{{- end }}
{{- if eq .role "leader" }}
- --node-rank
- "0"
{{- end }}
{{- with .root }}
- --master-port
- {{ .Values.multiNode.masterPort | quote }}
- --shard-grpc-port
- {{ .Values.multiNode.shardGrpcPort | quote }}
- --cluster-secret-file
- {{ include "tandem.clusterSecretPath" . | quote }}
{{- end }}
{{- end -}}

{{/* The router publishes KV-cache events on a ZMQ PUB socket (and answers replays) bound on every interface. */}}
{{- define "tandem.kvEventsArgs" }}
- --kv-events-endpoint
- {{ printf "tcp://*:%d" (int .Values.kvEvents.port) | quote }}
{{- if .Values.kvEvents.replayPort }}
- --kv-events-replay-endpoint
- {{ printf "tcp://*:%d" (int .Values.kvEvents.replayPort) | quote }}
{{- end }}
{{- if .Values.kvEvents.topic }}
- --kv-events-topic
- {{ .Values.kvEvents.topic | quote }}
{{- end }}
{{- if .Values.kvEvents.hashSeed }}
- --kv-events-hash-seed
- {{ .Values.kvEvents.hashSeed | quote }}
{{- end }}
{{- end -}}

{{- define "tandem.endpointPickerName" -}}
{{- printf "%s-epp" (include "tandem.fullname" . | trunc 59 | trimSuffix "-") -}}
{{- end -}}

{{/* The endpoint picker's labels: distinct from Tandem's own, so no Tandem selector ever picks the picker's pod. */}}
{{- define "tandem.endpointPickerSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-epp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.endpointPickerLabels" -}}
{{ include "tandem.endpointPickerSelectorLabels" . }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
