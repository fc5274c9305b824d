{{/* The image every fabricdra pod runs: repository@digest when `image.digest` is set (pinned:
IfNotPresent can never serve a stale cached image), else repository:tag, the tag defaulting to
appVersion. Values read with `dig`: `helm upgrade --reuse-values` from a chart without them
renders as their default (docs/install.md, "Upgrade"). */}}
{{- define "fabricdra.image" -}}
{{- $digest := dig "image" "digest" "" .Values.AsMap }}
{{- if $digest }}
{{- .Values.image.repository }}@{{ $digest }}
{{- else }}
{{- .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
{{- end }}

{{/* The app.kubernetes.io/name label and the stem of the workloads' names (`nameOverride`);
the stem alone (`fullnameOverride`). */}}
{{- define "fabricdra.name" -}}
{{- dig "nameOverride" "" .Values.AsMap | default "fabricdra" }}
{{- end }}
{{- define "fabricdra.fullname" -}}
{{- dig "fullnameOverride" "" .Values.AsMap | default (include "fabricdra.name" .) }}
{{- end }}

{{- define "fabricdra.labels" -}}
app.kubernetes.io/name: {{ include "fabricdra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* A pod template's metadata: the chart's labels and the component (the selector's), over
`podLabels` (the schema refuses the chart's own keys there), and `podAnnotations`. Called with
(dict "root" $ "component" "node"). */}}
{{- define "fabricdra.podMetadata" -}}
{{- $values := .root.Values.AsMap }}
labels:
  {{- with dig "podLabels" dict $values }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- include "fabricdra.labels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
{{- with dig "podAnnotations" dict $values }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* `serviceAccount.annotations` of the chart's ServiceAccounts (e.g. a cloud IAM role). */}}
{{- define "fabricdra.serviceAccountAnnotations" -}}
{{- with dig "serviceAccount" "annotations" dict .Values.AsMap }}
annotations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Whether the node agents run the active probes: `verification.activeProbes` true or
false as said; `auto` (the default) exactly when `verification.image` is set, the only way
the probes can run (the agent's own image has no tools): without one a node would hold every
GPU and NIC with a bandwidth figure Unverified, and no gang would place
(docs/install.md, "What a first install offers"). "true" or "". */}}
{{- define "fabricdra.activeProbes" -}}
{{- $active := .Values.verification.activeProbes }}
{{- if eq (toString $active) "auto" }}
{{- if .Values.verification.image }}true{{ end }}
{{- else if $active }}true{{ end }}
{{- end }}

{{/* The multi-node NVLink check: `auto` exactly when the active probes run and the GPUs are
ours (beside NVIDIA's GPU driver no agent of ours verifies them, so no node could pass);
`true`/`false` as said. "true" or "". */}}
{{- define "fabricdra.fabricCheck" -}}
{{- $required := toString .Values.verification.fabricCheck.required }}
{{- if eq $required "auto" }}
{{- if and (include "fabricdra.activeProbes" .) .Values.gpus.enabled }}true{{ end }}
{{- else if eq $required "true" }}true{{ end }}
{{- end }}

{{/* toolkitCdiDirs cleaned (no trailing slash: `/var/run/cdi/` is the cdiDir, and the
template would mount it a second time, read-only, shadowing the folder the agent writes to),
each once, as a JSON list. */}}
{{- define "fabricdra.toolkitCdiDirs" -}}
{{- $dirs := list }}
{{- range .Values.toolkitCdiDirs }}
{{- $dirs = append $dirs (clean .) }}
{{- end }}
{{- toJson (uniq $dirs) }}
{{- end }}

{{/* Service account names: fixed, because the admission policy and the controller's IMEX
DaemonSets name them. */}}
{{- define "fabricdra.nodeServiceAccount" -}}fabricdra-node{{- end }}
{{- define "fabricdra.controllerServiceAccount" -}}fabricdra-controller{{- end }}
{{- define "fabricdra.imexServiceAccount" -}}fabricdra-imex-daemon{{- end }}

{{- define "fabricdra.devicesEnabled" -}}
{{- if or .Values.gpus.enabled .Values.rdma.enabled }}true{{ end }}
{{- end }}

{{- /* A probe command: this pod's own DRA socket in the folder given exists. Its name is
dra-<pod UID>.sock, with the UID cut where the whole path would be too long for a socket
(docs/kubelet-plugin.md), so: a socket whose name part is a prefix of this pod's UID. */}}
{{- define "fabricdra.ownSocketProbe" -}}
for s in {{ . }}/dra-*.sock; do i=${s##*/dra-}; i=${i%.sock}; case "$FABRICDRA_POD_UID" in "$i"*) test -S "$s" && exit 0;; esac; done; exit 1
{{- end }}

{{- /* A liveness command: this pod's own DRA socket in the folder given (as ownSocketProbe)
completes a gRPC (HTTP/2) handshake within 5 s, i.e. the plugin's server still answers. */}}
{{- define "fabricdra.ownSocketAnswers" -}}
for s in {{ . }}/dra-*.sock; do i=${s##*/dra-}; i=${i%.sock}; case "$FABRICDRA_POD_UID" in "$i"*) test -S "$s" && exec python3 -c 'import sys, grpc; grpc.channel_ready_future(grpc.insecure_channel("unix://" + sys.argv[1])).result(timeout=5)' "$s";; esac; done; exit 1
{{- end }}

{{- /* The NVIDIA driver's mount for a plugin container, given driverRoot without its trailing
slash: the host's /usr for a driver on the host (`/`), else the driver root's parent, whose
new mounts (a driver container replaced at an upgrade) reach the container (HostToContainer). */}}
{{- define "fabricdra.driverMount" -}}
{{- if . -}}
- {name: driver-root-parent, mountPath: /driver-root-parent, readOnly: true, mountPropagation: HostToContainer}
{{- else -}}
- {name: driver-usr, mountPath: /driver-root/usr, readOnly: true}
{{- end -}}
{{- end }}
