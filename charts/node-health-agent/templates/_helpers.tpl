{{/* The release's object names: fullnameOverride, the release name, or <release>-node-health-agent. */}}
{{- define "nha.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nha.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nha.labels" -}}
{{ include "nha.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The agent's ServiceAccount: serviceAccount.name, else the release's name. */}}
{{- define "nha.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "nha.fullname" .) -}}
{{- end -}}

{{- define "nha.serviceAccount" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "nha.serviceAccountName" . }}
{{- end -}}

{{- define "nha.killSwitch" -}}
{{ include "nha.fullname" . }}-kill-switch
{{- end -}}

{{/* A budget's size: max(minimum, floor(percent x nodes / 100)); the node count from taintBudget.nodes or a lookup.
     Call with (dict "ctx" $ "b" <the budget's values>). */}}
{{- define "nha.quotaSize" -}}
{{- $b := .b -}}
{{- $nodes := int .ctx.Values.taintBudget.nodes -}}
{{- if eq $nodes 0 -}}
{{- $list := lookup "v1" "Node" "" "" -}}
{{- $nodes = len (default (list) (get (default (dict) $list) "items")) -}}
{{- end -}}
{{- /* No count (helm template, Argo CD, no right to list nodes): the minimum, the smallest
     budget, so the agents taint and disrupt too few nodes rather than too many. */ -}}
{{- max (int $b.minimum) (div (mul $nodes (int $b.percent)) 100) -}}
{{- end -}}

{{/* How a budget was sized, for its annotation. */}}
{{- define "nha.nodeCount" -}}
{{- $nodes := int .Values.taintBudget.nodes -}}
{{- if eq $nodes 0 -}}
{{- $list := lookup "v1" "Node" "" "" -}}
{{- $nodes = len (default (list) (get (default (dict) $list) "items")) -}}
{{- end -}}
{{- if eq $nodes 0 }}unknown at render: the minimum; set taintBudget.nodes{{ else }}{{ $nodes }} nodes{{ end -}}
{{- end -}}

{{- define "nha.budgetSize" -}}
{{- include "nha.quotaSize" (dict "ctx" . "b" .Values.taintBudget) -}}
{{- end -}}

{{- define "nha.disruptionBudgetSize" -}}
{{- include "nha.quotaSize" (dict "ctx" . "b" .Values.disruptionBudget) -}}
{{- end -}}

{{/* Namespaces whose pods the drain never evicts: the config's skip_namespaces and the release's. */}}
{{- define "nha.neverDrained" -}}
{{- $skip := list "kube-system" -}}
{{- $k := get (default (dict) .Values.config) "kubernetes" | default (dict) -}}
{{- $d := get $k "drain" | default (dict) -}}
{{- if hasKey $d "skip_namespaces" }}{{ $skip = $d.skip_namespaces }}{{ end -}}
{{- $all := append $skip .Release.Namespace | uniq -}}
{{- printf "[%s]" (include "nha.celStrings" $all) -}}
{{- end -}}

{{- define "nha.celStrings" -}}
{{- $out := list -}}
{{- range . }}{{ $out = append $out (printf "'%s'" .) }}{{ end -}}
{{- join ", " $out -}}
{{- end -}}

{{/* The metrics endpoint's scheme and the probes' handler. */}}
{{- define "nha.scheme" -}}
{{- if .Values.metrics.tls.enabled }}HTTPS{{ else }}HTTP{{ end -}}
{{- end -}}

{{- define "nha.probe" -}}
{{- if and .Values.metrics.tls.enabled .Values.metrics.tls.clientAuth -}}
tcpSocket: {port: metrics}
{{- else -}}
httpGet: {path: /healthz, port: metrics, scheme: {{ include "nha.scheme" . }}}
{{- end -}}
{{- end -}}

{{/* agent.toml: the user's config with what the chart's objects and mounts fix on top. */}}
{{- define "nha.config" -}}
{{- $fixed := dict
  "agent" (dict "state_dir" "/var/lib/node-health-agent")
  "paths" (dict "procfs" "/host/proc" "sysfs" "/host/sys" "rootfs" "/host/root")
  "metrics" (dict "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port)) "telemetry_path" .Values.metrics.path)
  "kubernetes" (dict
    "taint_prefix" .Values.kubernetes.taintPrefix
    "condition_prefix" .Values.kubernetes.conditionPrefix
    "kill_switch" (dict "namespace" .Release.Namespace "name" (include "nha.killSwitch" .))
    "budget" (dict "enabled" .Values.taintBudget.enabled "namespace" .Values.taintBudget.namespace "quota_name" .Values.taintBudget.quotaName)
    "disruption_budget" (dict "enabled" .Values.disruptionBudget.enabled "namespace" .Values.disruptionBudget.namespace "quota_name" .Values.disruptionBudget.quotaName)
    "breaker" (dict "enabled" .Values.breaker.enabled "namespace" .Values.breaker.namespace "quota_name" .Values.breaker.quotaName))
-}}
{{- if .Values.metrics.tls.enabled -}}
{{- $tls := dict "cert_file" "/etc/node-health-agent/tls/tls.crt" "key_file" "/etc/node-health-agent/tls/tls.key" -}}
{{- if .Values.metrics.tls.clientAuth -}}
{{- $_ := set $tls "client_ca_file" "/etc/node-health-agent/tls/ca.crt" -}}
{{- end -}}
{{- $_ := set $fixed.metrics "tls" $tls -}}
{{- end -}}
{{- if .Values.metrics.basicAuth.enabled -}}
{{- if not .Values.metrics.basicAuth.users -}}
{{- fail "metrics.basicAuth.users: give at least one user and its bcrypt hash (htpasswd -nBC 10 prometheus)" -}}
{{- end -}}
{{- $_ := set $fixed.metrics "basic_auth_users" .Values.metrics.basicAuth.users -}}
{{- end -}}
{{- $cfg := mergeOverwrite (deepCopy (default (dict) .Values.config)) $fixed -}}
{{- /* Helm reads every number in values as a float: write 8.0 back as 8, and 6.7108864e+07
     as 67108864 (a float key takes an integer too). */ -}}
{{- $toml := toToml $cfg -}}
{{- range $m := regexFindAll "= -?[0-9]+(\\.[0-9]+)?e\\+[0-9]+\n" $toml -1 -}}
{{- $n := $m | trimPrefix "= " | trimSuffix "\n" | float64 -}}
{{- if eq ($n | int64 | float64) $n -}}
{{- $toml = replace $m (printf "= %d\n" ($n | int64)) $toml -}}
{{- end -}}
{{- end -}}
{{- regexReplaceAll "(?m)^(\\s*[A-Za-z0-9_\"-]+ = -?[0-9]+)\\.0$" $toml "${1}" -}}
{{- end -}}
