{{/* The image every fabricdra pod runs: repository:tag, the tag defaulting to appVersion. */}}
{{- define "fabricdra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "fabricdra.labels" -}}
app.kubernetes.io/name: fabricdra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
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
