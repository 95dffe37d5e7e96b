{{/* Names: <release>-crucible (or the release name when it already says crucible), short enough for suffixes. */}}
{{- define "crucible.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "crucible.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "crucible.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
What each workload is and which Secrets it gets. platform: a Crucible pod that may call the core services;
testStore: a grader pod (the only ones given the test-store Secret and egress to the test store);
upstream: the pod generates on vLLM when vllm.enabled (CRUCIBLE_ENGINE=upstream, CRUCIBLE_UPSTREAM_URL);
token: whose service token the pod uses (secrets.tokens); callers: the services it accepts calls from, whose
tokens its token Secret holds in CRUCIBLE_TRUSTED_TOKENS (MAY_CALL in services/common/auth.py, inverted).
Workers serve nothing, so they have no callers and read CRUCIBLE_SERVICE_TOKEN alone.
*/}}
{{- define "crucible.components" -}}
gateway: {image: gateway, port: 8000, database: gateway, token: gateway, callers: [], platform: true, admin: true}
ledger: {image: ledger, port: 8001, database: ledger, token: ledger, callers: [gateway, trainer, inference, grader], platform: true}
trainer: {image: trainer, port: 8002, database: trainer, token: trainer, callers: [gateway, inference], platform: true, broker: true, artifacts: true, training: true}
inference: {image: inference, port: 8003, database: inference, token: inference, callers: [gateway, grader], platform: true, artifacts: true, upstream: true}
grader: {image: grader, port: 8004, database: grader, token: grader, callers: [gateway, trainer], platform: true, broker: true, testStore: true, artifacts: true}
train-worker: {image: trainer, database: trainer, token: trainer, platform: true, broker: true, artifacts: true, queue: train, app: trainer_service.tasks, training: true}
grader-worker: {image: grader, database: grader, token: grader, platform: true, broker: true, testStore: true, artifacts: true, queue: eval, app: grader.tasks}
{{- end -}}

{{/* The name of SERVICE's token Secret: (dict "root" $ "service" SERVICE) */}}
{{- define "crucible.tokenSecret" -}}
{{- index (default dict .root.Values.secrets.tokens) .service | required (printf "secrets.tokens.%s is required" .service) -}}
{{- end -}}

{{/* The selector shared by every pod of this release. */}}
{{- define "crucible.releaseSelectorLabels" -}}
app.kubernetes.io/name: {{ include "crucible.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* (dict "root" $ "component" NAME [ "pool" POOL ]) */}}
{{- define "crucible.selectorLabels" -}}
{{ include "crucible.releaseSelectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- with .pool }}
crucible.io/pool: {{ . }}
{{- end }}
{{- end -}}

{{- define "crucible.labels" -}}
{{ include "crucible.selectorLabels" . }}
app.kubernetes.io/part-of: crucible
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* (dict "root" $ "component" NAME "spec" SPEC [ "pool" POOL ]): the labels NetworkPolicies select on. */}}
{{- define "crucible.podLabels" -}}
{{ include "crucible.labels" . }}
{{- if .spec.platform }}
crucible.io/platform: "true"
{{- end }}
{{- if .spec.testStore }}
crucible.io/test-store-access: "true"
{{- end }}
{{- if .migrate }}
crucible.io/migrate: "true"
{{- end }}
{{- end -}}

{{/* (dict "root" $ "name" IMAGE-KEY) */}}
{{- define "crucible.image" -}}
{{- $repo := index .root.Values.image.repositories .name | required (printf "image.repositories.%s is required" .name) -}}
{{- printf "%s%s:%s" .root.Values.image.registry $repo (default .root.Chart.AppVersion .root.Values.image.tag) -}}
{{- end -}}

{{/* Settings that hold secrets must come from Secrets: `config` goes to every pod. */}}
{{- define "crucible.checkConfig" -}}
{{- if .Values.secrets.platform -}}
{{- fail "secrets.platform (one token shared by every service) is gone: each service has its own token Secret, secrets.tokens.<service> (docs/operators.md)" -}}
{{- end -}}
{{- range $key, $_ := .Values.config -}}
{{- if has $key (list "CRUCIBLE_SERVICE_TOKEN" "CRUCIBLE_TRUSTED_TOKENS" "CRUCIBLE_ADMIN_KEY" "CRUCIBLE_BROKER_URL" "CRUCIBLE_DATABASE_URL" "CRUCIBLE_GRADER_TEST_STORE_URL" "CRUCIBLE_GRADER_TEST_SEED") -}}
{{- fail (printf "config.%s would reach every pod: it belongs in a Secret (see `secrets`)" $key) -}}
{{- end -}}
{{- if has $key (list "CRUCIBLE_TRAIN_DEVICES" "CRUCIBLE_TRAIN_RECIPE_DEVICES") -}}
{{- fail (printf "config.%s: set training.devices and training.recipeDevices (the GPU pools request that many GPUs)" $key) -}}
{{- end -}}
{{- if and $.Values.vllm.enabled (has $key (list "CRUCIBLE_ENGINE" "CRUCIBLE_UPSTREAM_URL")) -}}
{{- fail (printf "config.%s: with vllm.enabled the chart points inference at its vLLM server (engine upstream)" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
env and envFrom of a Crucible container: (dict "root" $ "spec" SPEC). The token Secret is read key by key, so
a worker gets its service's CRUCIBLE_SERVICE_TOKEN and not the callers' tokens in CRUCIBLE_TRUSTED_TOKENS.
*/}}
{{- define "crucible.env" -}}
{{- $root := .root -}}
{{- $full := include "crucible.fullname" $root -}}
{{- $s3 := $root.Values.artifacts.s3 -}}
env:
  - {name: CRUCIBLE_DATA_DIR, value: /data}
  - {name: CRUCIBLE_GATEWAY_URL, value: "http://{{ $full }}-gateway:8000"}
  - {name: CRUCIBLE_LEDGER_URL, value: "http://{{ $full }}-ledger:8001"}
  - {name: CRUCIBLE_TRAINER_URL, value: "http://{{ $full }}-trainer:8002"}
  - {name: CRUCIBLE_INFERENCE_URL, value: "http://{{ $full }}-inference:8003"}
  - {name: CRUCIBLE_GRADER_URL, value: "http://{{ $full }}-grader:8004"}
  - {name: HF_HUB_OFFLINE, value: "1"}
  - {name: TRANSFORMERS_OFFLINE, value: "1"}
{{- if and .spec.upstream $root.Values.vllm.enabled }}
  - {name: CRUCIBLE_ENGINE, value: upstream}
  - {name: CRUCIBLE_UPSTREAM_URL, value: "http://{{ $full }}-vllm:8000/v1"}
{{- end }}
{{- if .spec.training }}
  - {name: CRUCIBLE_TRAIN_DEVICES, value: {{ $root.Values.training.devices | int | toString | quote }}}
  - {name: CRUCIBLE_TRAIN_RECIPE_DEVICES, value: {{ $root.Values.training.recipeDevices | toString | quote }}}
{{- end }}
{{- range $key, $value := $root.Values.config }}
  - name: {{ $key }}
    value: {{ $value | toString | quote }}
{{- end }}
{{- if and .spec.artifacts $s3.enabled }}
  - {name: CRUCIBLE_ARTIFACTS_S3_ENDPOINT, value: {{ $s3.endpoint | quote }}}
  - {name: CRUCIBLE_ARTIFACTS_S3_BUCKET, value: {{ $s3.bucket | required "artifacts.s3.bucket is required" | quote }}}
  - {name: CRUCIBLE_ARTIFACTS_S3_REGION, value: {{ $s3.region | quote }}}
  - {name: CRUCIBLE_ARTIFACTS_S3_PREFIX, value: {{ $s3.prefix | quote }}}
{{- with $s3.credentialsSecret }}
  - name: AWS_ACCESS_KEY_ID
    valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_ACCESS_KEY_ID}}
  - name: AWS_SECRET_ACCESS_KEY
    valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_SECRET_ACCESS_KEY}}
{{- end }}
{{- end }}
{{- with .spec.token }}
{{- $secret := include "crucible.tokenSecret" (dict "root" $root "service" .) }}
  - name: CRUCIBLE_SERVICE_TOKEN
    valueFrom: {secretKeyRef: {name: {{ $secret }}, key: CRUCIBLE_SERVICE_TOKEN}}
{{- if $.spec.callers }}
  - name: CRUCIBLE_TRUSTED_TOKENS
    valueFrom: {secretKeyRef: {name: {{ $secret }}, key: CRUCIBLE_TRUSTED_TOKENS}}
{{- end }}
{{- end }}
envFrom:
  - secretRef: {name: {{ index $root.Values.secrets.databases .spec.database | required (printf "secrets.databases.%s is required" .spec.database) }}}
{{- if .spec.admin }}
  - secretRef: {name: {{ $root.Values.secrets.gateway }}}
{{- end }}
{{- if .spec.broker }}
  - secretRef: {name: {{ $root.Values.secrets.broker }}}
{{- end }}
{{- if .spec.testStore }}
  - secretRef: {name: {{ $root.Values.secrets.testStore }}}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every Crucible pod: (dict "root" $) */}}
{{- define "crucible.podSpecCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
securityContext: {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* /data: the artifacts volume where the workload uses artifacts, else scratch space; /tmp: scratch. */}}
{{- define "crucible.volumeMounts" -}}
volumeMounts:
  - {name: data, mountPath: /data}
  - {name: tmp, mountPath: /tmp}
{{- if .shm }}
  - {name: shm, mountPath: /dev/shm}
{{- end }}
{{- end -}}

{{- define "crucible.volumes" -}}
volumes:
{{- if .spec.artifacts }}
  - name: data
    persistentVolumeClaim: {claimName: {{ include "crucible.artifactsClaim" .root }}}
{{- else }}
  - {name: data, emptyDir: {}}
{{- end }}
  - {name: tmp, emptyDir: {}}
{{- with .shm }}
  - name: shm
    emptyDir: {medium: Memory, sizeLimit: {{ . }}}
{{- end }}
{{- end -}}

{{- define "crucible.artifactsClaim" -}}
{{- default (printf "%s-artifacts" (include "crucible.fullname" .)) .Values.artifacts.existingClaim -}}
{{- end -}}

{{/* Probes of an HTTP service: (dict "startup" FAILURES). Readiness: GET /readyz (the service and what it needs can
    serve: traffic waits for it); start-up and liveness: GET /healthz (the process answers: a dependency still warming
    up or down restarts nothing). */}}
{{- define "crucible.httpProbes" -}}
startupProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: {{ .startup | int }}
readinessProbe:
  httpGet: {path: /readyz, port: http}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: http}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/*
Probes of a Celery worker: the worker holds an established connection to the broker. (A broadcast ping is
no use here: a solo-pool worker does not answer while it runs a training job.) Nothing of the project is
imported, so the check is cheap.
*/}}
{{- define "crucible.workerProbeCommand" -}}
- python
- -c
- >-
  import os, urllib.parse as up;
  u = up.urlsplit(os.environ["CRUCIBLE_BROKER_URL"]);
  port = u.port or {"amqp": 5672, "amqps": 5671}.get(u.scheme, 6379);
  rows = [line.split() for name in ("/proc/net/tcp", "/proc/net/tcp6") if os.path.exists(name) for line in list(open(name))[1:]];
  raise SystemExit(0 if any(r[3] == "01" and int(r[2].rsplit(":", 1)[1], 16) == port for r in rows) else 1)
{{- end -}}

{{- define "crucible.workerProbes" -}}
readinessProbe:
  exec:
    command: {{- include "crucible.workerProbeCommand" . | nindent 6 }}
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 10
  failureThreshold: 3
livenessProbe:
  exec:
    command: {{- include "crucible.workerProbeCommand" . | nindent 6 }}
  initialDelaySeconds: 60
  periodSeconds: 60
  timeoutSeconds: 10
  failureThreshold: 5
{{- end -}}
