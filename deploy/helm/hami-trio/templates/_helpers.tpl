{{/*
Names, labels and the checks every rendering must pass.
*/}}

{{- define "hami-trio.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name, at most 63 characters (a DNS label). */}}
{{- define "hami-trio.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hami-trio.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable for the release's life (a DaemonSet selector is immutable). */}}
{{- define "hami-trio.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hami-trio.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node-agent
{{- end }}

{{- define "hami-trio.labels" -}}
helm.sh/chart: {{ include "hami-trio.chart" . }}
{{ include "hami-trio.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "hami-trio.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "hami-trio.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "hami-trio.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Where the broker lives on the host and in the agent (fixed: the device plugin's
allocation mounts this host directory read-only into workloads at /tmp/vgpulock/hostpid). */}}
{{- define "hami-trio.brokerDir" -}}
/var/run/hami/hostpid
{{- end }}

{{/* Where the broker keeps its lock: beside the broker directory, never in it.  Workloads get
the broker directory (read-only: it does not stop flock), so a lock there could be held by any
workload's root process and no later broker would start.  Only the agent mounts this one. */}}
{{- define "hami-trio.brokerLockDir" -}}
/var/run/hami/hostpid-lock
{{- end }}

{{/* hostPID: the explicit value, or (null, the default) exactly when the broker is on or
exited processes are to be left out of the sums (telling them from running ones needs it). */}}
{{- define "hami-trio.hostPID" -}}
{{- $explicit := .Values.devicePlugin.hostPID }}
{{- if kindIs "invalid" $explicit }}
{{- or .Values.devicePlugin.hostPIDBroker.enabled .Values.metrics.excludeExitedProcesses }}
{{- else }}
{{- $explicit }}
{{- end }}
{{- end }}

{{/* The MIG lock's directory: what the agent mounts from the host (not all of /tmp). */}}
{{- define "hami-trio.migLockDir" -}}
{{- dir .Values.migLockPath }}
{{- end }}

{{/*
Checks that the schema cannot express with a clear message.  Included by the DaemonSet, so a
failing check stops the whole rendering (helm install / upgrade / template).
*/}}
{{- define "hami-trio.validate" -}}
{{- if and .Values.devicePlugin.hostPIDBroker.enabled (eq .Values.devicePlugin.hostPID false) }}
{{- fail "devicePlugin.hostPIDBroker.enabled=true requires devicePlugin.hostPID=true: the broker answers each caller with its PID as the kernel reports it in the agent's PID namespace, which is the host's only with hostPID. Set devicePlugin.hostPID=true, or devicePlugin.hostPIDBroker.enabled=false." }}
{{- end }}
{{- range splitList "/" .Values.migLockPath }}
{{- if or (eq . ".") (eq . "..") }}
{{- fail (printf "migLockPath %s must not contain . or .. components: its directory is mounted from the host as named" $.Values.migLockPath) }}
{{- end }}
{{- end }}
{{- if .Values.networkPolicy.enabled }}
{{- if and (empty .Values.networkPolicy.scraper.namespaceSelector) (empty .Values.networkPolicy.scraper.podSelector) }}
{{- fail "networkPolicy.enabled=true needs networkPolicy.scraper.namespaceSelector or networkPolicy.scraper.podSelector: with both empty every pod in every namespace could reach the metrics port, which is what the policy is for preventing" }}
{{- end }}
{{- end }}
{{- $managedEnv := list "LIBVGPU_HOSTPID_BROKER" "HOOK_PATH" "NODE_NAME" "HAMI_RESYNC_INTERVAL" "NVIDIA_VISIBLE_DEVICES" "HAMI_TRIO_DEBUG_BIND_ADDRESS" }}
{{- range .Values.extraEnv }}
{{- if has .name $managedEnv }}
{{- fail (printf "extraEnv must not set %s: the chart manages it (see devicePlugin.hostPIDBroker.enabled, hookPath, resyncInterval, nvidiaVisibleDevices, debug.bindAddress)" .name) }}
{{- end }}
{{- end }}
{{- $managedFlags := list "--metrics-bind-address" "--legacy-metrics" "--exclude-exited-processes" "--log-format" "--log-level" "--broker-socket-path" "--broker-lock-path" "--prepare-lock-parent" "--mig-lock-path" "--hook-path" "--node-name" "--resync-interval" "--debug-bind-address" }}
{{- range .Values.extraArgs }}
{{- $flag := first (splitList "=" (toString .)) }}
{{- if has $flag $managedFlags }}
{{- fail (printf "extraArgs must not pass %s: the chart manages it (see metrics, debug, log, migLockPath, hookPath, resyncInterval, devicePlugin.hostPIDBroker.enabled)" $flag) }}
{{- end }}
{{- end }}
{{- end }}
