{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "dne.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name; objects that add a suffix stay under 63 characters because of the trunc 50. */}}
{{- define "dne.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dne.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dne.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dne.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dne.labels" -}}
helm.sh/chart: {{ include "dne.chart" . }}
{{ include "dne.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: {{ .Values.mode }}
{{- end }}

{{- define "dne.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dne.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dne.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* "true" when the extender runs its own Lease (`--leader-elect`); only in standalone mode. */}}
{{- define "dne.ownLeaderElection" -}}
{{- if eq .Values.mode "standalone" }}
{{- $le := .Values.extender.leaderElection.enabled }}
{{- if kindIs "invalid" $le }}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- else if $le }}true{{ end }}
{{- end }}
{{- end }}

{{/*
Two replicas that may bind at once hand the same GPU out twice: each has its own ledger. Refused
when more than one replica would be an active binder without a Lease to order them (issue 36 §1).
In scheduler mode each kube-scheduler replica calls its own sidecar, and only a sidecar that
follows the scheduler's Lease fences the pod cache when its scheduler takes over.
*/}}
{{- define "dne.validateBinders" -}}
{{- if gt (int .Values.replicas) 1 }}
{{- if and (eq .Values.mode "standalone") (not (include "dne.ownLeaderElection" .)) }}
{{- fail "mode=standalone with replicas > 1 needs extender.leaderElection.enabled (null or true): without it every replica binds behind the one Service and the same device is handed out twice" }}
{{- end }}
{{- if and (eq .Values.mode "scheduler") (not .Values.extender.followSchedulerLease) }}
{{- fail "mode=scheduler with replicas > 1 needs extender.followSchedulerLease=true: a sidecar that does not follow its kube-scheduler's Lease cannot fence its cache when that scheduler takes over, and may hand out a device the previous leader's last binding holds" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the sidecar follows the kube-scheduler's Lease (`--follow-scheduler-lease`). */}}
{{- define "dne.followLease" -}}
{{- if and (eq .Values.mode "scheduler") .Values.extender.followSchedulerLease }}true{{ end }}
{{- end }}

{{/* "true" when the binary makes the LEADER_ELECTION_API_CALLS (Lease RBAC needed). */}}
{{- define "dne.needsLeases" -}}
{{- if or (include "dne.ownLeaderElection" .) (include "dne.followLease" .) }}true{{ end }}
{{- end }}

{{/* "true" when the verbs are served over TLS. */}}
{{- define "dne.tls" -}}
{{- $t := .Values.tls }}
{{- $source := or $t.secretName $t.certManager.enabled }}
{{- if kindIs "invalid" $t.enabled }}
{{- if $source }}true{{ end }}
{{- else if $t.enabled }}
{{- if not $source }}{{ fail "tls.enabled=true needs tls.secretName or tls.certManager.enabled" }}{{ end }}true
{{- end }}
{{- end }}

{{/* The extender's Secret (serving certificate + the CA of allowed clients). */}}
{{- define "dne.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "dne.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/* scheduler mode: the kube-scheduler container's client-certificate Secret. */}}
{{- define "dne.tlsClientSecretName" -}}
{{- if .Values.tls.clientSecretName }}{{ .Values.tls.clientSecretName }}
{{- else if .Values.tls.certManager.enabled }}{{ printf "%s-client-tls" (include "dne.fullname" .) }}
{{- else }}{{ fail "scheduler mode with TLS needs tls.clientSecretName (the kube-scheduler container's client certificate) or tls.certManager.enabled" }}
{{- end }}
{{- end }}

{{/* Where the extender container mounts its Secret. */}}
{{- define "dne.tlsDir" -}}/etc/device-numa-extender/tls{{- end }}

{{/* scheduler mode: where the kube-scheduler container mounts its client Secret. */}}
{{- define "dne.clientTlsDir" -}}/etc/kubernetes/device-numa-extender-client{{- end }}

{{/* The URL kube-scheduler calls: the sidecar on loopback, or the Service's cluster DNS name. */}}
{{- define "dne.urlPrefix" -}}
{{- $scheme := ternary "https" "http" (eq (include "dne.tls" .) "true") }}
{{- if eq .Values.mode "scheduler" }}
{{- printf "%s://127.0.0.1:%d%s" $scheme (int .Values.extender.port) .Values.extender.pathPrefix }}
{{- else }}
{{- printf "%s://%s.%s.svc:%d%s" $scheme (include "dne.fullname" .) .Release.Namespace (int .Values.extender.port) .Values.extender.pathPrefix }}
{{- end }}
{{- end }}

{{/*
The `extenders:` entry, as YAML (a list of one). Fields are exactly those of kube-scheduler's
Extender config (kubescheduler.config.k8s.io/v1); nodeCacheCapable keeps requests to node names.
*/}}
{{- define "dne.extendersStanza" -}}
extenders:
  - urlPrefix: {{ include "dne.urlPrefix" . | quote }}
    filterVerb: filter
    {{- /* ranking=filter: filter's answer carries the ranking; no scores to weigh. */}}
    {{- if eq .Values.extenderConfig.ranking "prioritize" }}
    prioritizeVerb: prioritize
    weight: {{ int64 .Values.extenderConfig.weight }}
    {{- end }}
    preemptVerb: preempt
    bindVerb: bind
    {{- if include "dne.tls" . }}
    enableHTTPS: true
    tlsConfig:
      {{- if eq .Values.mode "scheduler" }}
      certFile: {{ printf "%s/tls.crt" (include "dne.clientTlsDir" .) | quote }}
      keyFile: {{ printf "%s/tls.key" (include "dne.clientTlsDir" .) | quote }}
      caFile: {{ printf "%s/ca.crt" (include "dne.clientTlsDir" .) | quote }}
      {{- else }}
      certFile: {{ .Values.extenderConfig.tlsConfig.certFile | quote }}
      keyFile: {{ .Values.extenderConfig.tlsConfig.keyFile | quote }}
      caFile: {{ .Values.extenderConfig.tlsConfig.caFile | quote }}
      {{- end }}
    {{- else }}
    enableHTTPS: false
    {{- end }}
    httpTimeout: {{ .Values.extenderConfig.httpTimeout | quote }}
    nodeCacheCapable: {{ .Values.extenderConfig.nodeCacheCapable }}
    ignorable: {{ .Values.extenderConfig.ignorable }}
    {{- if not (and (eq .Values.mode "scheduler") .Values.extenderConfig.routeAllPods) }}
    {{- /* kube-scheduler refuses kubernetes.io/ names here (not extended resource names): the
    webhook renames such requests to their current names instead. */}}
    {{- $stanza := list }}
    {{- range (include "dne.managedResources" . | fromYamlArray) }}{{ if not (hasPrefix "kubernetes.io/" .name) }}{{ $stanza = append $stanza . }}{{ end }}{{ end }}
    {{- with $stanza }}
    managedResources:
      {{- range . }}
      - name: {{ .name | quote }}
        ignoredByScheduler: {{ .ignoredByScheduler }}
      {{- end }}
    {{- end }}
    {{- end }}
{{- end }}

{{/* extenderConfig.managedResources as the scheduler gets them: with extender.gpuShareTotals
koord-manager or extender, the GPU share names are counted (their node totals are advertised, so
kube-scheduler's preemption can propose victims for a pod asking for a share). A YAML list. */}}
{{- define "dne.managedResources" -}}
{{- $counted := ne .Values.extender.gpuShareTotals "ignored" }}
{{- $shares := list "koordinator.sh/gpu-core" "koordinator.sh/gpu-memory" "koordinator.sh/gpu-memory-ratio" }}
{{- $out := list }}
{{- range .Values.extenderConfig.managedResources }}
{{- $ignored := .ignoredByScheduler }}
{{- if and $counted (has .name $shares) }}{{ $ignored = false }}{{ end }}
{{- $out = append $out (dict "name" .name "ignoredByScheduler" $ignored) }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* Flags for `device-numa-extender serve`; each one is in the binary's documented flag set. */}}
{{- define "dne.extenderArgs" -}}
{{- include "dne.validateBinders" . }}
{{- $e := .Values.extender }}
{{- /* scheduler mode: verbs on loopback only (kube-scheduler is in the same pod). */}}
{{- $host := ternary "127.0.0.1" "0.0.0.0" (eq .Values.mode "scheduler") }}
{{- $args := list "serve" (printf "--listen=%s:%d" $host (int $e.port)) (printf "--probe-address=0.0.0.0:%d" (int $e.probePort)) }}
{{- if include "dne.tls" . }}
{{- $dir := include "dne.tlsDir" . }}
{{- $args = append $args (printf "--tls-cert-file=%s/tls.crt" $dir) }}
{{- $args = append $args (printf "--tls-key-file=%s/tls.key" $dir) }}
{{- if .Values.tls.verifyClients }}{{ $args = append $args (printf "--tls-client-ca-file=%s/ca.crt" $dir) }}{{ end }}
{{- $args = append $args (printf "--tls-reload-interval=%s" .Values.tls.reloadInterval) }}
{{- end }}
{{- with $e.pathPrefix }}{{ $args = append $args (printf "--path-prefix=%s" .) }}{{ end }}
{{- with $e.requireKinds }}{{ $args = append $args (printf "--require-kinds=%s" (join "," .)) }}{{ end }}
{{- with $e.maxStaleness }}{{ $args = append $args (printf "--max-staleness=%s" .) }}{{ end }}
{{- $args = append $args (printf "--log-format=%s" $e.logFormat) }}
{{- $args = append $args (printf "--log-level=%s" $e.logLevel) }}
{{- $args = append $args (printf "--body-limit-bytes=%d" (int64 $e.bodyLimitBytes)) }}
{{- $args = append $args (printf "--request-timeout=%s" $e.requestTimeout) }}
{{- $args = append $args (printf "--max-concurrency=%d" (int64 $e.maxConcurrency)) }}
{{- $args = append $args (printf "--body-budget-bytes=%d" (int64 $e.bodyBudgetBytes)) }}
{{- $args = append $args (printf "--body-read-timeout=%s" $e.bodyReadTimeout) }}
{{- $c := $e.connections }}
{{- $args = append $args (printf "--max-connections=%d" (int64 $c.maxConnections)) }}
{{- $args = append $args (printf "--probe-max-connections=%d" (int64 $c.probeMaxConnections)) }}
{{- $args = append $args (printf "--header-read-timeout=%s" $c.headerReadTimeout) }}
{{- $args = append $args (printf "--idle-timeout=%s" $c.idleTimeout) }}
{{- $args = append $args (printf "--max-connection-age=%s" $c.maxConnectionAge) }}
{{- $args = append $args (printf "--max-header-bytes=%d" (int64 $c.maxHeaderBytes)) }}
{{- $args = append $args (printf "--assume-ttl=%s" $e.assumeTtl) }}
{{- $args = append $args (printf "--requeue=%t" $e.requeue.enabled) }}
{{- if $e.requeue.enabled }}{{ $args = append $args (printf "--requeue-interval=%s" $e.requeue.interval) }}{{ end }}
{{- $args = append $args (printf "--dra-ownership=%t" $e.dra.ownership) }}
{{- $args = append $args (printf "--gpu-share-totals=%s" $e.gpuShareTotals) }}
{{- if eq .Values.extenderConfig.ranking "filter" }}{{ $args = append $args "--ranking=filter" }}{{ end }}
{{- if $e.dra.ownership }}{{ $args = append $args (printf "--dra-handover-grace=%s" $e.dra.handoverGrace) }}{{ end }}
{{- if $e.dra.allowExtendedResources }}{{ $args = append $args "--allow-dra-extended-resources" }}{{ end }}
{{- $args = append $args (printf "--dra-cpu-drivers=%s" (join "," $e.dra.cpuDrivers)) }}
{{- with $e.scoreStrategy }}{{ $args = append $args (printf "--score-strategy=%s" .) }}{{ end }}
{{- with $e.fragmentationMix }}
{{- if ne $e.scoreStrategy "fragmentation" }}{{ fail "extender.fragmentationMix needs extender.scoreStrategy=fragmentation: the binary refuses a workload mix no strategy reads" }}{{ end }}
{{- $args = append $args (printf "--fragmentation-mix=%s" .) }}
{{- end }}
{{- with $e.scoreWeights }}
{{- $pairs := list }}
{{- range $k, $v := . }}{{ $pairs = append $pairs (printf "%s=%v" $k $v) }}{{ end }}
{{- $args = append $args (printf "--score-weights=%s" (join "," $pairs)) }}
{{- end }}
{{- if include "dne.followLease" . }}
{{- $args = append $args (printf "--follow-scheduler-lease=%s" .Values.scheduler.leaderElection.resourceName) }}
{{- else if include "dne.ownLeaderElection" . }}
{{- $le := $e.leaderElection }}
{{- $args = append $args "--leader-elect" }}
{{- $args = append $args (printf "--leader-elect-lease-name=%s" $le.leaseName) }}
{{- $args = append $args (printf "--leader-elect-lease-duration=%s" $le.leaseDuration) }}
{{- $args = append $args (printf "--leader-elect-renew-deadline=%s" $le.renewDeadline) }}
{{- $args = append $args (printf "--leader-elect-retry-period=%s" $le.retryPeriod) }}
{{- end }}
{{- if .Values.webhook.enabled }}
{{- $w := .Values.webhook }}
{{- $dir := include "dne.webhookTlsDir" . }}
{{- $args = append $args (printf "--webhook-listen=0.0.0.0:%d" (int $w.port)) }}
{{- $args = append $args (printf "--webhook-tls-cert-file=%s/tls.crt" $dir) }}
{{- $args = append $args (printf "--webhook-tls-key-file=%s/tls.key" $dir) }}
{{- $args = append $args (printf "--webhook-scheduler-name=%s" (include "dne.webhookSchedulerName" .)) }}
{{- $names := list }}
{{- range .Values.extenderConfig.managedResources }}{{ $names = append $names .name }}{{ end }}
{{- $args = append $args (printf "--webhook-managed-resources=%s" (join "," $names)) }}
{{- if $w.routeCpusetQos }}{{ $args = append $args "--webhook-route-cpuset-qos" }}{{ end }}
{{- end }}
{{- range $e.extraArgs }}{{ $args = append $args . }}{{ end }}
{{- toYaml $args }}
{{- end }}

{{/* The extender container, shared by both modes. */}}
{{- define "dne.extenderContainer" -}}
- name: extender
  image: {{ include "dne.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    {{- include "dne.extenderArgs" . | nindent 4 }}
  env:
    # Default lease namespace and identity for leader election (--leader-elect-lease-namespace,
    # --leader-elect-identity); in scheduler mode POD_NAME is matched against the scheduler's
    # `<hostname>_<uuid>` holder identity, and a pod's hostname is its name.
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: POD_NAMESPACE
      valueFrom:
        fieldRef:
          fieldPath: metadata.namespace
    {{- with .Values.extender.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    {{- if ne .Values.mode "scheduler" }}
    - name: verbs
      containerPort: {{ .Values.extender.port }}
      protocol: TCP
    {{- end }}
    - name: metrics
      containerPort: {{ .Values.extender.probePort }}
      protocol: TCP
    {{- if .Values.webhook.enabled }}
    - name: webhook
      containerPort: {{ .Values.webhook.port }}
      protocol: TCP
    {{- end }}
  # Liveness only says the process answers; cache sync and leadership are readiness, so neither a
  # slow bootstrap nor being the standby ever restarts the container.
  startupProbe:
    httpGet:
      path: /healthz
      port: metrics
    periodSeconds: {{ .Values.extender.probes.startup.periodSeconds }}
    failureThreshold: {{ .Values.extender.probes.startup.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    periodSeconds: {{ .Values.extender.probes.liveness.periodSeconds }}
    timeoutSeconds: {{ .Values.extender.probes.liveness.timeoutSeconds }}
    failureThreshold: {{ .Values.extender.probes.liveness.failureThreshold }}
  # 503 until every watched kind's initial list is replayed into the caches. standalone mode:
  # also while this replica is not the leader, so the Service routes the verbs to the leader
  # only. scheduler mode (`?standby=ok`): a synced standby is ready, so a PodDisruptionBudget
  # counts it (its kube-scheduler calls its own sidecar; no Service routes by readiness, and
  # the verbs still serve only the leader).
  readinessProbe:
    httpGet:
      path: {{ ternary "/readyz?standby=ok" "/readyz" (eq .Values.mode "scheduler") }}
      port: metrics
    periodSeconds: {{ .Values.extender.probes.readiness.periodSeconds }}
    timeoutSeconds: {{ .Values.extender.probes.readiness.timeoutSeconds }}
    failureThreshold: {{ .Values.extender.probes.readiness.failureThreshold }}
  resources:
    {{- toYaml .Values.extender.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  {{- if or (include "dne.tls" .) .Values.webhook.enabled }}
  volumeMounts:
    {{- if include "dne.tls" . }}
    # A Secret volume: kubelet swaps its files atomically on update; the extender re-reads them.
    - name: extender-tls
      mountPath: {{ include "dne.tlsDir" . }}
      readOnly: true
    {{- end }}
    {{- if .Values.webhook.enabled }}
    - name: webhook-tls
      mountPath: {{ include "dne.webhookTlsDir" . }}
      readOnly: true
    {{- end }}
  {{- end }}
{{- end }}

{{/* Pod-level settings shared by both modes. */}}
{{- define "dne.podSpecCommon" -}}
serviceAccountName: {{ include "dne.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.affinity }}
affinity:
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else if and (gt (int .Values.replicas) 1) (ne .Values.podAntiAffinity "none") }}
{{- /* Replicas on different nodes, so one node's loss does not take the leader and its standby. */}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "dne.selectorLabels" . | fromYaml)) }}
affinity:
  podAntiAffinity:
    {{- if eq .Values.podAntiAffinity "hard" }}
    requiredDuringSchedulingIgnoredDuringExecution:
      {{- toYaml (list $term) | nindent 6 }}
    {{- else }}
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          {{- toYaml $term | nindent 10 }}
    {{- end }}
{{- end }}
{{- end }}

{{/* "true" when the PodDisruptionBudget is rendered: as set, or by default only where it
protects something without blocking drains: scheduler mode (a synced standby counts as ready)
with more than one replica. In standalone mode only the leader is ready, so any budget would
forbid evicting the leader and hang every drain of its node. */}}
{{- define "dne.pdb" -}}
{{- $p := .Values.podDisruptionBudget }}
{{- if kindIs "invalid" $p.enabled }}
{{- if and (eq .Values.mode "scheduler") (gt (int .Values.replicas) 1) }}true{{ end }}
{{- else if $p.enabled }}true{{ end }}
{{- end }}

{{- define "dne.podAnnotations" -}}
{{- if .Values.prometheusScrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.extender.probePort | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The secondary kube-scheduler's KubeSchedulerConfiguration. */}}
{{- define "dne.schedulerConfig" -}}
{{- $ignored := list }}
{{- range (include "dne.managedResources" . | fromYamlArray) }}
{{- if .ignoredByScheduler }}{{ $ignored = append $ignored .name }}{{ end }}
{{- end -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: ""
  qps: {{ .Values.scheduler.clientConnection.qps }}
  burst: {{ .Values.scheduler.clientConnection.burst }}
leaderElection:
  leaderElect: true
  resourceLock: leases
  resourceNamespace: {{ .Release.Namespace }}
  resourceName: {{ .Values.scheduler.leaderElection.resourceName }}
profiles:
  - schedulerName: {{ .Values.scheduler.schedulerName }}
    # The extender sees only the nodes that survive in-tree filters and this sample; GPU nodes
    # must never be sampled away.
    percentageOfNodesToScore: 100
    {{- if and .Values.extenderConfig.routeAllPods $ignored }}
    pluginConfig:
      # routeAllPods: the stanza has no managedResources, so the per-device dimensions are
      # excluded from NodeResourcesFit here instead (ignoredByScheduler does exactly this).
      - name: NodeResourcesFit
        args:
          ignoredResources:
            {{- toYaml $ignored | nindent 12 }}
    {{- end }}
{{ include "dne.extendersStanza" . }}
{{- end }}

{{/* The admission webhook: the scheduler routed pods get. */}}
{{- define "dne.webhookSchedulerName" -}}
{{- if .Values.webhook.schedulerName }}{{ .Values.webhook.schedulerName }}
{{- else if eq .Values.mode "scheduler" }}{{ .Values.scheduler.schedulerName }}
{{- else }}{{ fail "webhook.enabled in standalone mode needs webhook.schedulerName (the profile that calls the extender)" }}
{{- end }}
{{- end }}

{{/* The admission webhook's Secret (tls.crt, tls.key; ca.crt when the chart or cert-manager made it). */}}
{{- define "dne.webhookSecretName" -}}
{{- if eq .Values.webhook.certificate.source "secret" }}{{ required "webhook.certificate.source=secret needs webhook.certificate.secretName" .Values.webhook.certificate.secretName }}
{{- else }}{{ default (printf "%s-webhook-tls" (include "dne.fullname" .)) .Values.webhook.certificate.secretName }}
{{- end }}
{{- end }}

{{/* The webhook Service's DNS name (the serving certificate's SAN). */}}
{{- define "dne.webhookHost" -}}
{{- printf "%s-webhook.%s.svc" (include "dne.fullname" .) .Release.Namespace }}
{{- end }}

{{/* Where the extender container mounts the webhook's Secret. */}}
{{- define "dne.webhookTlsDir" -}}/etc/device-numa-extender/webhook-tls{{- end }}

{{/*
The webhook's matchCondition (CEL, evaluated by the API server before it calls the webhook): a
pod that names no scheduler, the default one or the extender's, and requests or limits a managed
resource in any container or init container (or carries a cpuset QoS class, with
routeCpusetQos). The same rule as the binary's (`model::routing`); only these pods ever wait on
the webhook, so failurePolicy Fail cannot block any other pod. The extender's own pods are sent
too: their deprecated resource names are renamed, and a preset spec.nodeName is refused.
*/}}
{{- define "dne.webhookCondition" -}}
{{- $names := list }}
{{- range .Values.extenderConfig.managedResources }}{{ $names = append $names (printf "'%s'" .name) }}{{ end }}
{{- $set := printf "[%s]" (join ", " $names) }}
{{- $c := printf "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(k, k in %s)) || (has(c.resources.requests) && c.resources.requests.exists(k, k in %s)))" $set $set }}
{{- $wants := printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))" $c $c }}
{{- if .Values.webhook.routeCpusetQos }}
{{- $wants = printf "%s || (has(object.metadata.labels) && 'koordinator.sh/qosClass' in object.metadata.labels && object.metadata.labels['koordinator.sh/qosClass'] in ['LSE', 'LSR'])" $wants }}
{{- end }}
{{- /* A preset spec.nodeName is sent whatever scheduler the pod names: the webhook denies it (it reaches no scheduler). */}}
{{- printf "(!has(object.spec.schedulerName) || object.spec.schedulerName == '' || object.spec.schedulerName == 'default-scheduler' || object.spec.schedulerName == '%s' || (has(object.spec.nodeName) && object.spec.nodeName != '')) && (%s)" (include "dne.webhookSchedulerName" .) $wants }}
{{- end }}
