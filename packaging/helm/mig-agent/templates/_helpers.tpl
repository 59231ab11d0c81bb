{{/* The chart's name. */}}
{{- define "mig-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: objects are named after it. */}}
{{- define "mig-agent.fullname" -}}
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

{{- define "mig-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mig-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mig-agent.labels" -}}
{{ include "mig-agent.selectorLabels" . }}
app.kubernetes.io/part-of: mig-agent
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "mig-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mig-agent.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The settings file: the chart's typed values under their flag names, and
.Values.settings. Keys the chart owns are refused in .Values.settings.
*/}}
{{- define "mig-agent.settings" -}}
{{- $owned := dict
  "max-concurrent" "maxConcurrent" "pause-gpu-operator" "pauseGpuOperator"
  "default-config" "defaultConfig" "reboot-method" "rebootMethod" "config-file" "migConfig"
  "node-name" "the downward API" "namespace" "the release namespace"
  "metrics-address" "metrics.port" "state-dir" "hostPaths.stateDir"
  "pod-resources-socket" "hostPaths.podResources" "settings" "the chart"
  "nvml-library" "driver.root" "driver-root" "cdi.driverRoot" "driver-root-mount" "cdi.driverRoot"
  "cdi-spec-dir" "cdi.enabled" "toolkit-dir" "cdi.toolkitDir"
  "startup-taint" "startupTaints" "startupTaints" "startupTaints" "reboot-sentinel" "kured.sentinel" }}
{{- /* The GPU Operator's value names (ClusterPolicy spec.migManager), each
  mapped one to one; docs/install-gpu-operator.md has the table. */}}
{{- $mm := default dict .Values.migManager }}
{{- with (default dict $mm.gpuClientsConfig).name }}
{{- fail (printf "migManager.gpuClientsConfig.name (%s): the agent does not read a clients.yaml ConfigMap; list its systemd-services under settings.host-gpu-clients instead" .) }}
{{- end }}
{{- range $k, $v := .Values.settings }}
{{- if hasKey $owned $k }}
{{- fail (printf "settings.%s: set by the chart from %s; set that instead" $k (get $owned $k)) }}
{{- end }}
{{- end }}
{{- $mc := .Values.maxConcurrent }}
{{- if kindIs "string" $mc }}
{{- if not (regexMatch "^([0-9]+|([1-9][0-9]?|100)%)$" $mc) }}
{{- fail (printf "maxConcurrent: %q is neither a count nor a percentage from 1%% to 100%%" $mc) }}
{{- end }}
{{- else }}
{{- $mc = int $mc }}
{{- end }}
{{- $mmc := default dict $mm.config }}
{{- $s := dict
  "max-concurrent" $mc
  "pause-gpu-operator" .Values.pauseGpuOperator
  "default-config" (ternary $mmc.default .Values.defaultConfig (hasKey $mmc "default"))
  "reboot-method" (include "mig-agent.rebootMethod" .) }}
{{- if .Values.cdi.enabled }}
{{- $_ := set $s "cdi-spec-dir" "/var/run/cdi" }}
{{- $_ := set $s "toolkit-dir" (list .Values.cdi.toolkitDir) }}
{{- if .Values.cdi.driverRoot }}
{{- $_ := set $s "driver-root" .Values.cdi.driverRoot }}
{{- $_ := set $s "driver-root-mount" "/cdi-driver-root" }}
{{- end }}
{{- end }}
{{- if .Values.migConfig }}
{{- $_ := set $s "config-file" "/etc/mig-agent/config.yaml" }}
{{- else if or .Values.migConfigMap.name $mmc.name }}
{{- $_ := set $s "config-file" "/mig-parted-config/config.yaml" }}
{{- end }}
{{- if .Values.driver.root }}
{{- $_ := set $s "nvml-library" "/driver-root" }}
{{- end }}
{{- with .Values.startupTaints }}
{{- $_ := set $s "startup-taint" . }}
{{- end }}
{{- if eq (include "mig-agent.rebootMethod" .) "kured" }}
{{- $_ := set $s "reboot-sentinel" (printf "/kured-sentinel/%s" (base .Values.kured.sentinel)) }}
{{- end }}
{{- toYaml (merge $s (deepCopy (default dict .Values.settings))) }}
{{- end }}

{{/* Whether the agent needs the host's D-Bus socket. */}}
{{- define "mig-agent.needsDBus" -}}
{{- if or (has (include "mig-agent.rebootMethod" .) (list "logind" "systemctl")) (get (default dict .Values.settings) "host-gpu-clients") (get (default dict .Values.settings) "dbus-address") }}true{{- end }}
{{- end }}

{{/*
mig-agent.fromFile renders the manifests of a file under files/ (links to
packaging/kubernetes, so the plain manifests and the chart share one
source), renamed for the release: names starting with mig-agent take the
release's full name, namespaced objects go to the release namespace, the
agent's ServiceAccount is the release's. Takes (list $ "files/NAME").
*/}}
{{- define "mig-agent.fromFile" -}}
{{- $root := index . 0 }}
{{- $full := include "mig-agent.fullname" $root }}
{{- $sa := include "mig-agent.serviceAccountName" $root }}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($root.Files.Get (index . 1)) -1 }}
{{- $obj := fromYaml $doc }}
{{- if and $obj (hasKey $obj "kind") }}
{{- $md := $obj.metadata }}
{{- $_ := set $md "name" (regexReplaceAll "^mig-agent" $md.name $full) }}
{{- if hasKey $md "namespace" }}
{{- $_ := set $md "namespace" $root.Release.Namespace }}
{{- end }}
{{- $_ := set $md "labels" (merge (fromYaml (include "mig-agent.labels" $root)) (default dict $md.labels)) }}
{{- if hasKey $obj "roleRef" }}
{{- $_ := set $obj.roleRef "name" (regexReplaceAll "^mig-agent" $obj.roleRef.name $full) }}
{{- end }}
{{- range $s := default list $obj.subjects }}
{{- if eq $s.kind "ServiceAccount" }}
{{- $_ := set $s "name" $sa }}
{{- $_ := set $s "namespace" $root.Release.Namespace }}
{{- end }}
{{- end }}
{{- if or (eq $obj.kind "ValidatingAdmissionPolicyBinding") (eq $obj.kind "MutatingAdmissionPolicyBinding") }}
{{- $_ := set $obj.spec "policyName" (regexReplaceAll "^mig-agent" $obj.spec.policyName $full) }}
{{- end }}
{{- if eq $obj.kind "ValidatingAdmissionPolicy" }}
{{- range $c := $obj.spec.matchConditions }}
{{- if eq $c.name "mig-agent-service-account" }}
{{- $_ := set $c "expression" (printf "request.userInfo.username == 'system:serviceaccount:%s:%s'" $root.Release.Namespace $sa) }}
{{- end }}
{{- end }}
{{- range $v := $obj.spec.variables }}
{{- if eq $v.name "pauseGpuOperator" }}
{{- $_ := set $v "expression" (ternary "true" "false" (eq (toString $root.Values.pauseGpuOperator) "true")) }}
{{- end }}
{{- if eq $v.name "startupTaintKeys" }}
{{- $keys := list }}
{{- range $t := default list $root.Values.startupTaints }}
{{- $keys = append $keys (regexReplaceAll "^([^=:]+).*$" $t "${1}") }}
{{- end }}
{{- $_ := set $v "expression" (toJson (uniq $keys)) }}
{{- end }}
{{- if eq $v.name "agentUser" }}
{{- $_ := set $v "expression" (printf "'system:serviceaccount:%s:%s'" $root.Release.Namespace $sa) }}
{{- end }}
{{- end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The DaemonSet's nodeSelector: .Values.nodeSelector, and with
gpuOperator.deployLabel the GPU Operator's deploy label of its MIG manager.
*/}}
{{- define "mig-agent.nodeSelector" -}}
{{- $sel := deepCopy (default dict .Values.nodeSelector) }}
{{- if .Values.gpuOperator.deployLabel }}
{{- $_ := set $sel "nvidia.com/gpu.deploy.mig-manager" "true" }}
{{- end }}
{{- if $sel }}
{{- toYaml $sel }}
{{- end }}
{{- end }}

{{/*
mig-agent.requesterPolicy is "true" when the MutatingAdmissionPolicy is
rendered: requesterPolicy.enabled on Kubernetes 1.36 or later
(MutatingAdmissionPolicy admissionregistration.k8s.io/v1).
*/}}
{{- define "mig-agent.requesterPolicy" -}}
{{- if and .Values.requesterPolicy.enabled (semverCompare ">=1.36.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* Values that cannot go together, and what the cluster cannot serve. */}}
{{- define "mig-agent.validate" -}}
{{- if and .Values.migConfig .Values.migConfigMap.name }}
{{- fail "migConfig and migConfigMap.name both name the MIG config file: set one" }}
{{- end }}
{{- if and .Values.admissionPolicy.enabled (semverCompare "<1.30.0-0" .Capabilities.KubeVersion.Version) }}
{{- fail (printf "admissionPolicy.enabled needs Kubernetes 1.30 or later (ValidatingAdmissionPolicy v1 and the node-name token claim), this cluster is %s: set admissionPolicy.enabled=false (docs/install.md, \"Without the policy\")" .Capabilities.KubeVersion.Version) }}
{{- end }}
{{- end }}

{{/*
The ConfigMap holding the MIG config file: migConfigMap.name, else the GPU
Operator's name for it, migManager.config.name (key config.yaml in both).
*/}}
{{- define "mig-agent.migConfigMapName" -}}
{{- $mmc := default dict (default dict .Values.migManager).config -}}
{{- if .Values.migConfigMap.name -}}
{{- .Values.migConfigMap.name -}}
{{- else if $mmc.name -}}
{{- $mmc.name -}}
{{- end -}}
{{- end }}

{{/*
The agent's tolerations: .Values.tolerations, and each startup taint (the
agent must run on the node it lifts them from).
*/}}
{{- define "mig-agent.tolerations" -}}
{{- $tol := list }}
{{- range default list .Values.tolerations }}
{{- $tol = append $tol . }}
{{- end }}
{{- range $t := default list .Values.startupTaints }}
{{- $m := regexFindAll "^([^=:]+)(=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)$" $t -1 }}
{{- if not $m }}
{{- fail (printf "startupTaints: %q is not key[=value]:effect (effect NoSchedule, PreferNoSchedule or NoExecute)" $t) }}
{{- end }}
{{- $key := regexReplaceAll "^([^=:]+).*$" $t "${1}" }}
{{- $effect := regexReplaceAll "^.*:([A-Za-z]+)$" $t "${1}" }}
{{- if contains "=" $t }}
{{- $tol = append $tol (dict "key" $key "operator" "Equal" "value" (regexReplaceAll "^[^=]+=([^:]*):.*$" $t "${1}") "effect" $effect) }}
{{- else }}
{{- $tol = append $tol (dict "key" $key "operator" "Exists" "effect" $effect) }}
{{- end }}
{{- end }}
{{- toYaml $tol }}
{{- end }}

{{/*
mig-agent.migManagerEnv checks migManager.env, the GPU Operator's
environment for its MIG manager (the variables of mig-parted
cmd/nvidia-mig-manager/main.go), and returns the reboot method it sets
("" where it sets none). Each variable is mapped (WITH_REBOOT), accepted
where the chart already does what it asks, or refused with what to set
instead; docs/install-gpu-operator.md has the table.
*/}}
{{- define "mig-agent.migManagerEnv" -}}
{{- $v := .Values }}
{{- $reboot := "" }}
{{- $refer := dict
  "NODE_NAME" "set by the chart (the downward API)"
  "KUBECONFIG" "the agent uses its ServiceAccount; no kubeconfig"
  "GPU_CLIENTS_FILE" "the agent reads no clients.yaml: list its systemd-services under settings.host-gpu-clients"
  "NVIDIA_DRIVER_ROOT" "set cdi.driverRoot (the CDI step) and driver.root (NVML)"
  "DRIVER_ROOT" "set cdi.driverRoot (the CDI step) and driver.root (NVML)"
  "DRIVER_ROOT_CTR_PATH" "set by the chart from cdi.driverRoot"
  "NVIDIA_DEV_ROOT" "the agent takes the device nodes from the driver root (cdi.driverRoot)"
  "DEV_ROOT_CTR_PATH" "the agent takes the device nodes from the driver root (cdi.driverRoot)"
  "NVIDIA_CDI_HOOK_PATH" "set settings.cdi-hook-path"
  "RECONFIGURE_SCRIPT" "the agent applies a config itself; it runs no reconfigure script"
  "HOST_ROOT_MOUNT" "the agent reaches the host through D-Bus and the driver root, not a host root mount"
  "HOST_NVIDIA_DIR" "set cdi.toolkitDir"
  "HOST_MIG_MANAGER_STATE_FILE" "the agent keeps its state in hostPaths.stateDir"
  "HOST_KUBELET_SYSTEMD_SERVICE" "the agent never stops the kubelet; list host GPU clients under settings.host-gpu-clients" }}
{{- range $e := default list (default dict $v.migManager).env }}
{{- $name := toString $e.name }}
{{- $val := lower (toString (default "" $e.value)) }}
{{- if eq $name "WITH_REBOOT" }}
{{- if has $val (list "true" "1" "t") }}{{ $reboot = "logind" }}
{{- else if has $val (list "false" "0" "f" "") }}{{ $reboot = "none" }}
{{- else }}{{ fail (printf "migManager.env WITH_REBOOT=%q: not a boolean" $e.value) }}
{{- end }}
{{- else if eq $name "WITH_SHUTDOWN_HOST_GPU_CLIENTS" }}
{{- if and (has $val (list "true" "1" "t")) (not (get (default dict $v.settings) "host-gpu-clients")) }}
{{- fail "migManager.env WITH_SHUTDOWN_HOST_GPU_CLIENTS=true: list the host's GPU clients (the systemd-services of the operator's clients.yaml) under settings.host-gpu-clients" }}
{{- end }}
{{- else if eq $name "CONFIG_FILE" }}
{{- if ne (toString $e.value) "/mig-parted-config/config.yaml" }}
{{- fail (printf "migManager.env CONFIG_FILE=%q: the chart mounts the config file at /mig-parted-config/config.yaml from migManager.config.name or migConfigMap.name; set those (or migConfig)" $e.value) }}
{{- end }}
{{- else if eq $name "CDI_ENABLED" }}
{{- if ne (has $val (list "true" "1" "t")) (eq (toString $v.cdi.enabled) "true") }}
{{- fail (printf "migManager.env CDI_ENABLED=%q: set cdi.enabled=%v instead (it mounts the CDI spec directory)" $e.value (has $val (list "true" "1" "t"))) }}
{{- end }}
{{- else if eq $name "DEFAULT_GPU_CLIENTS_NAMESPACE" }}
{{- /* the agent finds the operator's operands on its node in every namespace */}}
{{- else if hasKey $refer $name }}
{{- fail (printf "migManager.env %s: %s" $name (get $refer $name)) }}
{{- else }}
{{- fail (printf "migManager.env %s: not a variable of NVIDIA's MIG manager; pass other variables in extraEnv" $name) }}
{{- end }}
{{- end }}
{{- $reboot }}
{{- end }}

{{/* The reboot method: migManager.env WITH_REBOOT where it is set, else rebootMethod. */}}
{{- define "mig-agent.rebootMethod" -}}
{{- default .Values.rebootMethod (include "mig-agent.migManagerEnv" .) }}
{{- end }}
