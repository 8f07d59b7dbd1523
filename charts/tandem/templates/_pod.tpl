{{/* The pod spec every Tandem pod shares: the Deployment's pods ("single") and a LeaderWorkerSet group's leader and
     workers. Called with (dict "root" $ "role" "single"|"leader"|"worker"). Only where the router runs ("single",
     "leader") does the pod get the HTTP port, the API key, the probes and the preStop sleep; a worker runs shards only. */}}
{{- define "tandem.podSpec" -}}
{{- $role := .role -}}
{{- $routes := ne $role "worker" -}}
{{- with .root -}}
terminationGracePeriodSeconds: {{ include "tandem.terminationGracePeriod" . }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if include "tandem.downloadsModel" . }}
initContainers:
  {{- include "tandem.downloadContainer" . | nindent 2 }}
{{- end }}
containers:
  - name: tandem
    image: {{ include "tandem.image" . | quote }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["tandem-launcher"]
    args:
      {{- include "tandem.launcherArgs" (dict "root" . "role" $role) | nindent 6 }}
    env:
      - name: HOME
        value: /tmp
      - name: HF_HOME
        value: /data/huggingface
      # The model is in the cache PVC by now (the init container fetched it, or it was put there for an
      # offline install): serving never contacts the Hub, and holds no Hugging Face token.
      - name: HF_HUB_OFFLINE
        value: "1"
      {{- if and $routes .Values.secrets.apiKey.existingSecret }}
      - name: API_KEY
        valueFrom:
          secretKeyRef:
            name: {{ .Values.secrets.apiKey.existingSecret }}
            key: {{ .Values.secrets.apiKey.key }}
      {{- end }}
      {{- if and $routes .Values.kvEvents.enabled }}
      # Lets kvEvents.topic name the pod, as llm-d's subscribers expect: "kv@$(POD_IP):<port>@<model>".
      - name: POD_IP
        valueFrom:
          fieldRef:
            fieldPath: status.podIP
      {{- end }}
    ports:
      {{- include "tandem.containerPorts" (dict "root" . "role" $role) | nindent 6 }}
    {{- if $routes }}
    {{- include "tandem.probes" . | nindent 4 }}
    lifecycle:
      preStop:
        exec:
          command: ["sleep", "{{ .Values.lifecycle.preStopSleepSeconds }}"]
    {{- end }}
    securityContext:
      {{- toYaml .Values.securityContext | nindent 6 }}
    resources:
      {{- $resources := deepCopy .Values.resources }}
      {{- if eq .Values.device "cuda" }}
      {{- $limits := get $resources "limits" | default dict }}
      {{- $_ := set $limits "nvidia.com/gpu" (int .Values.numShard) }}
      {{- $_ := set $resources "limits" $limits }}
      {{- end }}
      {{- toYaml $resources | nindent 6 }}
    volumeMounts:
      - name: shm
        mountPath: /dev/shm
      - name: tmp
        mountPath: /tmp
      - name: model-cache
        mountPath: /data
      {{- include "tandem.loraVolumeMount" . | nindent 6 }}
      {{- if include "tandem.multiNode" . }}
      - name: cluster-secret
        mountPath: /etc/tandem/cluster
        readOnly: true
      {{- end }}
volumes:
  - name: shm
    emptyDir:
      medium: Memory
      sizeLimit: {{ .Values.shm.sizeLimit }}
  - name: tmp
    emptyDir: {}
  {{- if .Values.modelCache.existingClaim }}
  - name: model-cache
    persistentVolumeClaim:
      claimName: {{ .Values.modelCache.existingClaim }}
  {{- else if and .Values.modelCache.create (not (include "tandem.multiNode" .)) }}
  - name: model-cache
    persistentVolumeClaim:
      claimName: {{ include "tandem.modelCacheClaim" . }}
  {{- else if not .Values.modelCache.create }}
  - name: model-cache
    emptyDir: {}
  {{- end }}
  {{- if .Values.lora.volume.existingClaim }}
  - name: lora-adapters
    persistentVolumeClaim:
      claimName: {{ .Values.lora.volume.existingClaim }}
      readOnly: true
  {{- end }}
  {{- if include "tandem.multiNode" . }}
  - name: cluster-secret
    secret:
      secretName: {{ include "tandem.clusterSecretName" . }}
      defaultMode: 0440
      items:
        - key: {{ .Values.multiNode.clusterSecret.key }}
          path: {{ .Values.multiNode.clusterSecret.key }}
  {{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Fetches the model into the cache PVC before the server starts; a model already complete there downloads
     nothing (one download per PVC, not per restart). The only container that talks to the Hub. */}}
{{- define "tandem.downloadContainer" -}}
- name: download
  image: {{ include "tandem.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["tandem-launcher"]
  args:
    {{- include "tandem.downloadArgs" . | nindent 4 }}
  env:
    - name: HOME
      value: /tmp
    - name: HF_HOME
      value: /data/huggingface
    {{- if .Values.hub.endpoint }}
    - name: HF_ENDPOINT
      value: {{ .Values.hub.endpoint | quote }}
    {{- end }}
    {{- if .Values.secrets.hfToken.existingSecret }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ .Values.secrets.hfToken.existingSecret }}
          key: {{ .Values.secrets.hfToken.key }}
    {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  # The main container's (without GPUs): converting a GGUF or pickle weights needs the model in memory.
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  volumeMounts:
    - name: tmp
      mountPath: /tmp
    - name: model-cache
      mountPath: /data
    {{- include "tandem.loraVolumeMount" . | nindent 4 }}
{{- end -}}

{{/* The adapters' volume (lora.volume), read-only, where adapter paths point. */}}
{{- define "tandem.loraVolumeMount" -}}
{{- if .Values.lora.volume.existingClaim }}
- name: lora-adapters
  mountPath: {{ .Values.lora.volume.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* Ports of the tandem container: the router's HTTP (and KV events) where it runs, each local rank's metrics
     port, and in a multi-node group the leader's rendezvous port and each worker rank's gRPC port. */}}
{{- define "tandem.containerPorts" -}}
{{- $role := .role -}}
{{- $root := .root -}}
{{- with .root -}}
{{- if ne $role "worker" }}
- name: http
  containerPort: {{ .Values.ports.http }}
{{- end }}
{{- range $rank := until (int .Values.numShard) }}
- name: shard-{{ $rank }}
  containerPort: {{ add $root.Values.ports.shardMetricsBase $rank }}
{{- end }}
{{- if and .Values.kvEvents.enabled (ne $role "worker") }}
- name: kv-events
  containerPort: {{ .Values.kvEvents.port }}
{{- if .Values.kvEvents.replayPort }}
- name: kv-replay
  containerPort: {{ .Values.kvEvents.replayPort }}
{{- end }}
{{- end }}
{{- if eq $role "leader" }}
- name: rendezvous
  containerPort: {{ .Values.multiNode.masterPort }}
{{- end }}
{{- if eq $role "worker" }}
{{- range $rank := until (int .Values.numShard) }}
- name: grpc-{{ $rank }}
  containerPort: {{ add $root.Values.multiNode.shardGrpcPort $rank }}
{{- end }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The router's probes (a worker runs no router: its failure shows as the leader's, and LWS restarts the group). */}}
{{- define "tandem.probes" -}}
# Until every shard has loaded and answers (/health 200): load + warm-up, within startupTimeoutSeconds.
startupProbe:
  httpGet:
    path: /health
    port: http
  periodSeconds: 10
  failureThreshold: {{ div .Values.lifecycle.startupTimeoutSeconds 10 }}
# Whether the router's HTTP server answers at all. Not /health: it answers 503 while the launcher restarts
# failed shards, which is the pod recovering on its own, not a pod to kill (the launcher exits, and the
# container restarts, when recovery fails for good).
livenessProbe:
  httpGet:
    path: /metrics
    port: http
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
# 200 only while serving: 503 while warming up, recovering shards, or draining after SIGTERM.
readinessProbe:
  httpGet:
    path: /ready
    port: http
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}
