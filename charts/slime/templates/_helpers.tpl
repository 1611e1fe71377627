{{/* Chart name. */}}
{{- define "slime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object name; short enough for the "-injection-webhook" suffix. */}}
{{- define "slime.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 42 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 42 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "slime.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Common labels. */}}
{{- define "slime.labels" -}}
helm.sh/chart: {{ include "slime.chart" . }}
app.kubernetes.io/name: {{ include "slime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: slime
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one webhook. Call with (dict "root" $ "component" "injection"). */}}
{{- define "slime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slime.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}-webhook
{{- end }}

{{/* Base name of a webhook's objects (Deployment, Service, ServiceAccount, ...). */}}
{{- define "slime.componentName" -}}
{{- printf "%s-%s-webhook" (include "slime.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Secret that holds ca.crt / tls.crt / tls.key of a webhook, mounted at /tls. */}}
{{- define "slime.tlsSecretName" -}}
{{- printf "%s-tls" (include "slime.componentName" .) }}
{{- end }}

{{/* cert-manager serving Certificate of a webhook. */}}
{{- define "slime.certificateName" -}}
{{- printf "%s-serving" (include "slime.componentName" .) }}
{{- end }}

{{- define "slime.caName" -}}
{{- printf "%s-ca" (include "slime.fullname" .) }}
{{- end }}

{{/*
The image both webhooks (and the test hook) run. A value left at a placeholder from the docs fails
the install here, with what to do, instead of pods stuck in ErrImagePull.
*/}}
{{- define "slime.image" -}}
{{- $repository := .Values.image.repository }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- $placeholder := or (regexMatch "[<>{}$\\s]" (printf "%s:%s" $repository $tag)) (regexMatch "(^|[./@])example\\.(com|org|net)([/:]|$)" $repository) (regexMatch "(?i)(^|/)(your[-_]?registry|registry[-_]here|change[-_]?me)([/:]|$)" $repository) }}
{{- if $placeholder }}
{{- fail (printf "image.repository=%q with tag %q is a placeholder, not an image: build the image, push it to your registry and set image.repository (and image.tag) to where you pushed it (docs/install.md, \"The image\")" $repository $tag) }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" $repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{/* "ns/name" of every mapped mirror Deployment, as a list (JSON). */}}
{{- define "slime.mirrorKeys" -}}
{{- $keys := list }}
{{- range .Values.scaling.mappings }}
{{- $keys = append $keys (printf "%s/%s" .mirror.namespace .mirror.name) }}
{{- end }}
{{- toJson $keys }}
{{- end }}

{{/*
"ns/name" of every mirror the scaling webhook configuration matches, sorted, as a list (JSON): the
mirrors of scaling.mappings and scaling.extraMirrors (mirrors of a ConfigMap managed outside the
chart). extraMirrors is refused with createConfigMap=true: nothing would map them.
*/}}
{{- define "slime.matchedMirrors" -}}
{{- $keys := include "slime.mirrorKeys" . | fromJsonArray }}
{{- if and .Values.scaling.extraMirrors .Values.scaling.createConfigMap }}
{{- fail "scaling.extraMirrors names mirrors of a ConfigMap you manage yourself; with scaling.createConfigMap=true the chart's ConfigMap maps only scaling.mappings, so nothing would map them: list them in scaling.mappings, or set createConfigMap=false" }}
{{- end }}
{{- range .Values.scaling.extraMirrors }}
{{- $key := printf "%s/%s" .namespace .name }}
{{- if has $key $keys }}
{{- fail (printf "scaling.extraMirrors names %s, which scaling.mappings already maps" $key) }}
{{- end }}
{{- $keys = append $keys $key }}
{{- end }}
{{- toJson ($keys | uniq | sortAlpha) }}
{{- end }}

{{/* Sorted unique namespaces of the MachineDeployments (+ scaling.extraNamespaces), JSON list. */}}
{{- define "slime.mdNamespaces" -}}
{{- $ns := list }}
{{- range .Values.scaling.mappings }}
{{- $ns = append $ns .machineDeployment.namespace }}
{{- end }}
{{- $ns = concat $ns .Values.scaling.extraNamespaces }}
{{- toJson ($ns | uniq | sortAlpha) }}
{{- end }}

{{/* The mirror {name, namespace} of every mapping, as a list (JSON). */}}
{{- define "slime.mirrorRefs" -}}
{{- $refs := list }}
{{- range .Values.scaling.mappings }}{{- $refs = append $refs .mirror }}{{- end }}
{{- toJson $refs }}
{{- end }}

{{/* Sorted unique namespaces of the mirrors (+ scaling.extraMirrors, scaling.extraNamespaces), JSON list. */}}
{{- define "slime.mirrorNamespaces" -}}
{{- $ns := list }}
{{- range concat (include "slime.mirrorRefs" . | fromJsonArray) .Values.scaling.extraMirrors }}
{{- $ns = append $ns .namespace }}
{{- end }}
{{- $ns = concat $ns .Values.scaling.extraNamespaces }}
{{- toJson ($ns | uniq | sortAlpha) }}
{{- end }}

{{/*
"true" when this render talks to a live cluster (helm install/upgrade, --dry-run=server): a lookup of
the kube-system Namespace, which every cluster has, answers. Empty under `helm template`, `helm lint`
and --dry-run=client (no cluster: lookup answers nothing). Not the release namespace: with
`--create-namespace` Helm renders before it creates it, so a first install would look offline.
*/}}
{{- define "slime.live" -}}
{{- if lookup "v1" "Namespace" "" "kube-system" }}true{{ end }}
{{- end }}

{{/*
Fail early when an optional CRD group the rendered objects need is not served.
See `crdCheck` in values.yaml. Call with (dict "root" $ "apiVersion" "keda.sh/v1alpha1"
"kind" "ScaledObject" "value" "keda.enabled" "what" "KEDA").
*/}}
{{- define "slime.requireAPI" -}}
{{- $root := .root }}
{{- $mode := $root.Values.crdCheck }}
{{- $live := false }}
{{- if eq $mode "auto" }}
{{- $live = include "slime.live" $root }}
{{- end }}
{{- if or (eq $mode "always") $live }}
{{- if not ($root.Capabilities.APIVersions.Has .apiVersion) }}
{{- fail (printf "%s=true needs %s (%s %s) but the cluster does not serve it. Install %s first (this chart does not install CRDs), or set %s=false. For offline rendering pass --api-versions %s (crdCheck=%s)." .value .what .apiVersion .kind .what .value .apiVersion $mode) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level security context. */}}
{{- define "slime.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{/* Container-level security context. */}}
{{- define "slime.securityContext" -}}
{{- toYaml .Values.securityContext }}
{{- end }}

{{/*
Effective KEDA settings of one mapping, as JSON: `keda.*` with the mapping's `keda` overrides
applied key by key (nested maps such as `metrics` and `triggerMetadata` one level deep), so an
override to 0, false or "" wins too. "enabled" is true when a ScaledObject is rendered for it
(keda.enabled and the mapping does not set keda.enabled=false).
Call with (dict "root" $ "mapping" $m).
*/}}
{{- define "slime.mappingKeda" -}}
{{- $root := .root }}
{{- $k := omit (deepCopy $root.Values.keda) "enabled" }}
{{- $on := $root.Values.keda.enabled }}
{{- range $key, $val := (default dict .mapping.keda) }}
{{- if eq $key "enabled" }}
{{- $on = and $on $val }}
{{- else if and (kindIs "map" $val) (kindIs "map" (get $k $key)) }}
{{- $nested := get $k $key }}
{{- range $nk, $nv := $val }}{{- $_ := set $nested $nk $nv }}{{- end }}
{{- else }}
{{- $_ := set $k $key $val }}
{{- end }}
{{- end }}
{{- $_ := set $k "enabled" (and $on true) }}
{{- toJson $k }}
{{- end }}

{{/*
Python's repr() of a value as the scaling webhook's ConfigMap parser sees it after the chart
renders it (toYaml): strings quoted the way Python quotes them, an integral number as an int,
null as None, booleans as True/False, maps with their keys sorted (toYaml sorts them). The chart
quotes a bad value exactly as the service would, so both give the same message.
*/}}
{{- define "slime.pyrepr" -}}
{{- $v := . -}}
{{- if kindIs "invalid" $v -}}None
{{- else if kindIs "bool" $v -}}{{ ternary "True" "False" $v }}
{{- else if kindIs "string" $v -}}
{{- $s := $v | replace "\\" "\\\\" | replace "\n" "\\n" | replace "\r" "\\r" | replace "\t" "\\t" -}}
{{- if and (contains "'" $v) (not (contains "\"" $v)) -}}"{{ $s }}"
{{- else -}}'{{ $s | replace "'" "\\'" }}'
{{- end -}}
{{- else if kindIs "map" $v -}}
{{- $parts := list -}}
{{- range $k := keys $v | sortAlpha -}}
{{- $parts = append $parts (printf "%s: %s" (include "slime.pyrepr" $k) (include "slime.pyrepr" (get $v $k))) -}}
{{- end -}}
{ {{- join ", " $parts -}} }
{{- else if kindIs "slice" $v -}}
{{- $parts := list -}}
{{- range $v }}{{- $parts = append $parts (include "slime.pyrepr" .) -}}{{- end -}}
[{{ join ", " $parts }}]
{{- else if and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v) -}}{{ int64 $v }}
{{- else -}}{{ toString $v }}
{{- end -}}
{{- end }}

{{/* True ("true") for a DNS-1123 label (a namespace name), as common/meta.py's is_dns1123_label. */}}
{{- define "slime.isLabel" -}}
{{- if and (kindIs "string" .) (le (len .) 63) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}true{{ end }}
{{- end }}

{{/* True ("true") for a DNS-1123 subdomain (an object name), as common/meta.py's is_dns1123_subdomain. */}}
{{- define "slime.isSubdomain" -}}
{{- if and (kindIs "string" .) (le (len .) 253) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .) }}true{{ end }}
{{- end }}

{{/*
A Slurm block of a ConfigMap mapping item, checked as scaling_webhook/mappings.py's _block and
_endpoint check it, failing with the service's own message (tests/chart/test_mapping_messages.py
compares them on the same inputs). (dict "block" $b "where" "mappings[0].safeScaleIn" "allowed"
(list ...) "shared" true|false): shared = the mapping has a safeScaleIn endpoint this block may
use (nodeDemand only).
*/}}
{{- define "slime.checkSlurmBlock" -}}
{{- $b := .block }}
{{- $where := .where }}
{{- $endpointKeys := list "slurmrestd" "jwtSecret" "jwtKey" "apiVersion" "tokenUser" }}
{{- if not (kindIs "map" $b) }}
{{- fail (printf "%s: must be a map with keys %s" $where (join ", " .allowed)) }}
{{- end }}
{{- $unknown := list }}
{{- range $k := keys $b }}{{- if not (has $k $.allowed) }}{{- $unknown = append $unknown $k }}{{- end }}{{- end }}
{{- if $unknown }}
{{- fail (printf "%s: unknown key(s) %s; allowed: %s" $where (join ", " ($unknown | sortAlpha)) (join ", " .allowed)) }}
{{- end }}
{{- range $k := prepend $endpointKeys "partition" }}
{{- if and (hasKey $b $k) (or (not (kindIs "string" (get $b $k))) (not (trim (toString (get $b $k))))) }}
{{- fail (printf "%s.%s: must be a non-empty string" $where $k) }}
{{- end }}
{{- end }}
{{- if not .keysOnly }}
{{- if hasKey $b "partition" }}
{{- $partition := trim $b.partition }}
{{- if not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$" $partition) }}
{{- fail (printf "%s.partition: %s is not a Slurm partition name (letters, digits, '.', '_', '-')" $where (include "slime.pyrepr" $partition)) }}
{{- end }}
{{- if and (not .shared) (not (and (hasKey $b "slurmrestd") (hasKey $b "jwtSecret"))) }}
{{- fail (printf "%s: needs slurmrestd and jwtSecret (here, or in the mapping's safeScaleIn block)" $where) }}
{{- end }}
{{- end }}
{{- $check := true }}
{{- if not .shared }}
{{- range $k := list "slurmrestd" "jwtSecret" }}
{{- if not (hasKey $b $k) }}{{- fail (printf "%s: missing key %s" $where $k) }}{{- end }}
{{- end }}
{{- else }}
{{- $any := false }}
{{- range $k := $endpointKeys }}{{- if hasKey $b $k }}{{- $any = true }}{{- end }}{{- end }}
{{- if not $any }}{{- $check = false }}{{- end }}
{{- if and $any (not (and (hasKey $b "slurmrestd") (hasKey $b "jwtSecret"))) }}
{{- fail (printf "%s: give both slurmrestd and jwtSecret, or neither (to use the safeScaleIn endpoint)" $where) }}
{{- end }}
{{- end }}
{{- if $check }}
{{- /* Python's rstrip("/") takes every trailing slash. */}}
{{- $url := regexReplaceAll "/+$" (trim $b.slurmrestd) "" }}
{{- if not (regexMatch "^https?://[^/\\s:]+(:[0-9]{1,5})?(/\\S*)?$" $url) }}
{{- fail (printf "%s.slurmrestd: %s is not an http:// or https:// URL" $where (include "slime.pyrepr" $url)) }}
{{- end }}
{{- $ref := trim $b.jwtSecret }}
{{- $parts := splitList "/" $ref }}
{{- if or (ne (len $parts) 2) (not (index $parts 0)) (not (index $parts 1)) }}
{{- fail (printf "%s.jwtSecret: %s is not of the form <namespace>/<name>" $where (include "slime.pyrepr" $ref)) }}
{{- end }}
{{- if not (include "slime.isLabel" (index $parts 0)) }}
{{- fail (printf "%s.jwtSecret: namespace %s is not a valid DNS-1123 label" $where (include "slime.pyrepr" (index $parts 0))) }}
{{- end }}
{{- if not (include "slime.isSubdomain" (index $parts 1)) }}
{{- fail (printf "%s.jwtSecret: name %s is not a valid DNS-1123 subdomain" $where (include "slime.pyrepr" (index $parts 1))) }}
{{- end }}
{{- $jwtKey := "jwt_hs256.key" }}
{{- if hasKey $b "jwtKey" }}{{- $jwtKey = trim $b.jwtKey }}{{- end }}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" $jwtKey) }}
{{- fail (printf "%s.jwtKey: %s is not a valid Secret key" $where (include "slime.pyrepr" $jwtKey)) }}
{{- end }}
{{- if and (hasKey $b "apiVersion") (not (has (trim $b.apiVersion) (list "v0.0.42" "v0.0.43" "v0.0.44" "v0.0.45" "v0.0.46"))) }}
{{- fail (printf "%s.apiVersion: %s is not supported; use one of v0.0.42, v0.0.43, v0.0.44, v0.0.45, v0.0.46" $where (include "slime.pyrepr" $b.apiVersion)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A mapping's slurmHealth block, checked as scaling_webhook/mappings.py's _slurm_health checks it
(and scaling_webhook/machine_health/config.py's parse_duration and parse_max_unhealthy), in the
same order, with the same messages. (dict "block" $b "where" "mappings[0].slurmHealth" "shared"
true|false): shared = the mapping has a safeScaleIn or nodeDemand endpoint this block may use.
*/}}
{{- define "slime.checkSlurmHealth" -}}
{{- $b := .block }}
{{- $where := .where }}
{{- $allowed := list "slurmrestd" "jwtSecret" "jwtKey" "apiVersion" "tokenUser" "registrationTimeout" "unhealthyTimeout" "remediate" "maxUnhealthy" "slurmUser" }}
{{- include "slime.checkSlurmBlock" (dict "block" $b "where" $where "allowed" $allowed "shared" .shared "keysOnly" true) }}
{{- if and (not .shared) (not (and (hasKey $b "slurmrestd") (hasKey $b "jwtSecret"))) }}
{{- fail (printf "%s: needs slurmrestd and jwtSecret (here, or in the mapping's safeScaleIn or nodeDemand block)" $where) }}
{{- end }}
{{- include "slime.checkSlurmBlock" (dict "block" $b "where" $where "allowed" $allowed "shared" .shared) }}
{{- range $key := list "registrationTimeout" "unhealthyTimeout" }}
{{- if hasKey $b $key }}
{{- $v := get $b $key }}
{{- $w := printf "%s.%s" $where $key }}
{{- if or (kindIs "bool" $v) (kindIs "invalid" $v) (kindIs "map" $v) (kindIs "slice" $v) (and (kindIs "string" $v) (not (trim $v))) }}
{{- fail (printf "%s: must be a duration such as 15m or 900s, got %s" $w (include "slime.pyrepr" $v)) }}
{{- else if kindIs "string" $v }}
{{- if not (regexMatch "^([0-9]+(\\.[0-9]+)?(ms|h|m|s))+$" (trim $v)) }}
{{- fail (printf "%s: %s is not a duration such as 15m, 90s or 1h30m" $w (include "slime.pyrepr" $v)) }}
{{- end }}
{{- if regexMatch "^(0+(\\.0+)?(ms|h|m|s))+$" (trim $v) }}
{{- fail (printf "%s: must be longer than 0, got %s" $w (include "slime.pyrepr" $v)) }}
{{- end }}
{{- else if le (float64 $v) 0.0 }}
{{- fail (printf "%s: must be longer than 0, got %s" $w (include "slime.pyrepr" $v)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey $b "maxUnhealthy" }}
{{- $v := $b.maxUnhealthy }}
{{- $ok := false }}
{{- if and (or (kindIs "int" $v) (kindIs "int64" $v) (and (kindIs "float64" $v) (eq (float64 (int64 $v)) $v))) (ge (int64 $v) 0) }}{{- $ok = true }}{{- end }}
{{- if kindIs "string" $v }}
{{- $t := trim $v }}
{{- if regexMatch "^[0-9]+$" $t }}{{- $ok = true }}{{- end }}
{{- if and (regexMatch "^[0-9]{1,3}%$" $t) (le (int (trimSuffix "%" $t)) 100) }}{{- $ok = true }}{{- end }}
{{- end }}
{{- if not $ok }}
{{- fail (printf "%s.maxUnhealthy: %s is neither a count (0 or more) nor a percentage from 0%% to 100%% of the pool's Machines" $where (include "slime.pyrepr" $v)) }}
{{- end }}
{{- end }}
{{- if and (hasKey $b "remediate") (not (kindIs "bool" $b.remediate)) }}
{{- fail (printf "%s.remediate: must be true or false, got %s" $where (include "slime.pyrepr" $b.remediate)) }}
{{- end }}
{{- if hasKey $b "slurmUser" }}
{{- $u := $b.slurmUser }}
{{- if or (not (kindIs "string" $u)) (not (regexMatch "^[a-z_][a-z0-9_-]{0,31}$" (trim (toString $u)))) }}
{{- fail (printf "%s.slurmUser: %s is not a user name (SlurmUser in slurm.conf)" $where (include "slime.pyrepr" $u)) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One ConfigMap list item, checked as the scaling webhook's parser checks it (scaling_webhook/mappings.py),
failing with its messages: the keys a mapping's `config` may add, the safeScaleIn and nodeDemand
blocks, capacityAware. Then the cap: a pool is never uncapped (the service's text,
scaling_webhook/mappings.py; tests/chart/test_mapping_messages.py compares them). (dict "item" $item "where" "mappings[0]")
*/}}
{{- define "slime.checkMappingItem" -}}
{{- $item := .item }}
{{- $where := .where }}
{{- $options := list "maxReplicas" "safeScaleIn" "capacityAware" "nodeDemand" "slurmHealth" }}
{{- $unknown := list }}
{{- $hint := false }}
{{- range $k := keys $item }}
{{- if not (has $k (concat (list "mirror" "machineDeployment") $options)) }}
{{- $unknown = append $unknown $k }}
{{- if has (lower $k) (list "maxreplicas" "safescalein" "capacityaware" "nodedemand" "slurmhealth") }}{{- $hint = true }}{{- end }}
{{- end }}
{{- end }}
{{- if $unknown }}
{{- fail (printf "%s: unknown key(s) %s; allowed: mirror, machineDeployment%s" $where (join ", " ($unknown | sortAlpha)) (ternary (printf " (optional: %s)" (join ", " $options)) "" $hint)) }}
{{- end }}
{{- if hasKey $item "safeScaleIn" }}
{{- $w := printf "%s.safeScaleIn" $where }}
{{- $b := $item.safeScaleIn }}
{{- include "slime.checkSlurmBlock" (dict "block" $b "where" $w "allowed" (list "slurmrestd" "jwtSecret" "jwtKey" "apiVersion" "tokenUser" "drainTimeoutSeconds" "releasedNodes") "shared" false) }}
{{- if and (hasKey $b "drainTimeoutSeconds") (not (kindIs "invalid" $b.drainTimeoutSeconds)) }}
{{- $t := $b.drainTimeoutSeconds }}
{{- if or (not (or (kindIs "float64" $t) (kindIs "int64" $t) (kindIs "int" $t))) (le (float64 $t) 0.0) }}
{{- fail (printf "%s.drainTimeoutSeconds: must be a positive number of seconds, got %s" $w (include "slime.pyrepr" $t)) }}
{{- end }}
{{- end }}
{{- if and (hasKey $b "releasedNodes") (not (kindIs "invalid" $b.releasedNodes)) }}
{{- $r := $b.releasedNodes }}
{{- if or (not (kindIs "string" $r)) (not (has (trim $r) (list "future" "delete"))) }}
{{- fail (printf "%s.releasedNodes: %s is not one of future, delete (future keeps the released node's record in Slurm as FUTURE, delete removes it)" $w (include "slime.pyrepr" $r)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if hasKey $item "nodeDemand" }}
{{- $b := $item.nodeDemand }}
{{- $w := printf "%s.nodeDemand" $where }}
{{- $allowed := list "partition" "slurmrestd" "jwtSecret" "jwtKey" "apiVersion" "tokenUser" }}
{{- if and (kindIs "map" $b) (not (hasKey $b "partition")) }}
{{- /* The service checks the block's keys and strings before it asks for the partition. */}}
{{- include "slime.checkSlurmBlock" (dict "block" $b "where" $w "allowed" $allowed "shared" true "keysOnly" true) }}
{{- fail (printf "%s: missing key partition" $w) }}
{{- end }}
{{- include "slime.checkSlurmBlock" (dict "block" $b "where" $w "allowed" $allowed "shared" (hasKey $item "safeScaleIn")) }}
{{- end }}
{{- if hasKey $item "slurmHealth" }}
{{- include "slime.checkSlurmHealth" (dict "block" $item.slurmHealth "where" (printf "%s.slurmHealth" $where) "shared" (or (hasKey $item "safeScaleIn") (hasKey $item "nodeDemand"))) }}
{{- end }}
{{- if and (hasKey $item "capacityAware") (not (kindIs "bool" $item.capacityAware)) }}
{{- fail (printf "%s.capacityAware: must be true or false, got %s" $where (include "slime.pyrepr" $item.capacityAware)) }}
{{- end }}
{{- if and (not (hasKey $item "maxReplicas")) (not (and (hasKey $item "capacityAware") (eq $item.capacityAware true))) }}
{{- fail (printf "%s (mirror %s): maxReplicas is required unless capacityAware caps the pool: a mirror anyone can scale would otherwise ask for up to 2147483647 Machines" $where $item.mirror) }}
{{- end }}
{{- end }}

{{/*
The list items of the scaling ConfigMap, as JSON, after checking the mappings:
- two mappings may not share a mirror Deployment, nor a MachineDeployment (one writer each);
- maxReplicas: the mapping's explicit `maxReplicas`, else its KEDA maxReplicaCount when KEDA
  scales it; an explicit value above the KEDA maximum fails. A mapping with neither is refused
  unless its config has `capacityAware: true` (the pool is then capped at the hosts it can have);
- every item as the service's parser checks it (slime.checkMappingItem), and no partition whose
  node demand two mappings publish (one partition feeds one pool);
- `partition` is a Slurm partition name the service accepts (also a URL path segment).
*/}}
{{- define "slime.mappingItems" -}}
{{- $root := . }}
{{- $items := list }}
{{- $mds := dict }}
{{- $mirrors := dict }}
{{- $partitions := dict }}
{{- range $i, $m := $root.Values.scaling.mappings }}
{{- $mirror := printf "%s/%s" $m.mirror.namespace $m.mirror.name }}
{{- $md := printf "%s/%s" $m.machineDeployment.namespace $m.machineDeployment.name }}
{{- if hasKey $mirrors $mirror }}
{{- fail (printf "scaling.mappings[%v] and scaling.mappings[%d] both use mirror Deployment %s; a mirror may drive only one MachineDeployment" (get $mirrors $mirror) $i $mirror) }}
{{- end }}
{{- if hasKey $mds $md }}
{{- fail (printf "scaling.mappings[%v] and scaling.mappings[%d] both target MachineDeployment %s; one MachineDeployment must have one writer" (get $mds $md) $i $md) }}
{{- end }}
{{- $_ := set $mirrors $mirror $i }}
{{- $_ := set $mds $md $i }}
{{- if and (hasKey $m "partition") (not (regexMatch "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$" (toString $m.partition))) }}
{{- fail (printf "scaling.mappings[%d].partition: %s is not a Slurm partition name (letters, digits, '.', '_', '-')" $i (include "slime.pyrepr" $m.partition)) }}
{{- end }}
{{- $item := dict "mirror" $mirror "machineDeployment" $md }}
{{- $k := include "slime.mappingKeda" (dict "root" $root "mapping" $m) | fromJson }}
{{- if hasKey $m "maxReplicas" }}
{{- if and $k.enabled (gt (int $m.maxReplicas) (int $k.maxReplicaCount)) }}
{{- fail (printf "scaling.mappings[%d] (mirror %s -> MachineDeployment %s): maxReplicas %d is higher than its KEDA maxReplicaCount %d, so KEDA could never reach it; lower maxReplicas or raise keda.maxReplicaCount" $i $mirror $md (int $m.maxReplicas) (int $k.maxReplicaCount)) }}
{{- end }}
{{- $_ := set $item "maxReplicas" (int $m.maxReplicas) }}
{{- else if $k.enabled }}
{{- $_ := set $item "maxReplicas" (int $k.maxReplicaCount) }}
{{- end }}
{{- with $m.config }}{{- $item = merge $item (deepCopy .) }}{{- end }}
{{- if and $k.enabled (eq $k.demand "nodes") (not (hasKey $item "nodeDemand")) }}
{{- /* keda.demand=nodes: the ScaledObject reads /demand/<partition>, which this mapping must publish. */}}
{{- if not $m.partition }}
{{- fail (printf "scaling.mappings[%d].partition is required with keda.demand=nodes" $i) }}
{{- end }}
{{- $demand := dict "partition" $m.partition }}
{{- if not (hasKey $item "safeScaleIn") }}
{{- $source := $root.Values.scaling.nodeDemand }}
{{- if not (and $source.slurmrestd $source.jwtSecret.name $source.jwtSecret.namespace) }}
{{- fail (printf "scaling.mappings[%d] uses keda.demand=nodes: set scaling.nodeDemand.slurmrestd and scaling.nodeDemand.jwtSecret (or a safeScaleIn block in its config)" $i) }}
{{- end }}
{{- $_ := set $demand "slurmrestd" $source.slurmrestd }}
{{- $_ := set $demand "jwtSecret" (printf "%s/%s" $source.jwtSecret.namespace $source.jwtSecret.name) }}
{{- with $source.jwtKey }}{{- $_ := set $demand "jwtKey" . }}{{- end }}
{{- with $source.tokenUser }}{{- $_ := set $demand "tokenUser" . }}{{- end }}
{{- end }}
{{- $_ := set $item "nodeDemand" $demand }}
{{- end }}
{{- $where := printf "mappings[%d]" $i }}
{{- include "slime.checkMappingItem" (dict "item" $item "where" $where) }}
{{- if and (hasKey $item "nodeDemand") (kindIs "map" $item.nodeDemand) }}
{{- $p := trim (toString $item.nodeDemand.partition) }}
{{- if hasKey $partitions $p }}
{{- fail (printf "%s and %s both publish the node demand of partition %s; one partition feeds one pool" (get $partitions $p) $where (include "slime.pyrepr" $p)) }}
{{- end }}
{{- $_ := set $partitions $p $where }}
{{- end }}
{{- $items = append $items $item }}
{{- end }}
{{- toJson $items }}
{{- end }}

{{/* Secret with the client certificate kube-apiserver presents (admissionAuth, source generate). */}}
{{/* Whether some KEDA-scaled mapping reads node demand (keda.demand=nodes): "true" or "". */}}
{{- define "slime.usesNodeDemand" -}}
{{- range $m := .Values.scaling.mappings }}
{{- $k := include "slime.mappingKeda" (dict "root" $ "mapping" $m) | fromJson }}
{{- if and $k.enabled (eq $k.demand "nodes") }}true{{- end }}
{{- end }}
{{- end }}

{{/*
The users the scaling webhook lets scale a mapped mirror (SLIME_SCALE_REQUESTERS), as a comma list:
scaling.allowedRequesters, and keda.scaleRequesters when the chart's ScaledObjects scale some
mapping (KEDA's operator writes 0 <-> 1, the HPA controller 1 <-> N), and then the scaling webhook's
own ServiceAccount (its leader adopts a new mirror: it sets the mirror's replicas). Empty: whoever
RBAC lets.
*/}}
{{- define "slime.scaleRequesters" -}}
{{- $names := .Values.scaling.allowedRequesters }}
{{- $keda := false }}
{{- range $m := .Values.scaling.mappings }}
{{- if (include "slime.mappingKeda" (dict "root" $ "mapping" $m) | fromJson).enabled }}{{- $keda = true }}{{- end }}
{{- end }}
{{- if $keda }}{{- $names = concat $names .Values.keda.scaleRequesters }}{{- end }}
{{- if $names }}
{{- /* The leader itself writes a mirror's replicas when it adopts it (a Deployment UPDATE the webhook judges). */}}
{{- $names = append $names (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "slime.componentName" (dict "root" $ "component" "scaling"))) }}
{{- end }}
{{- join "," ($names | uniq) }}
{{- end }}

{{- define "slime.apiserverClientName" -}}
{{- printf "%s-apiserver-client" (include "slime.fullname" .) }}
{{- end }}

{{/* cert-manager client CA (Certificate, its Secret) of admissionAuth. */}}
{{- define "slime.clientCAName" -}}
{{- printf "%s-client-ca" (include "slime.fullname" .) }}
{{- end }}

{{/* True ("true") when the webhooks must require kube-apiserver's client certificate. */}}
{{- define "slime.enforceClientAuth" -}}
{{- if and .Values.admissionAuth.enabled .Values.admissionAuth.enforce }}true{{ end }}
{{- end }}

{{/*
The pod volume source that holds the client CA (admissionAuth), projected to the single file
ca.crt (mounted at /client-ca, so SLIME_CLIENT_CA_FILE=/client-ca/ca.crt). No subPath: the
kubelet then updates the file in place when the Secret/ConfigMap changes, and the services
re-read it.
*/}}
{{- define "slime.clientCAVolume" -}}
{{- $ca := .Values.admissionAuth.clientCA }}
{{- if eq $ca.source "configMap" }}
configMap:
  name: {{ $ca.name }}
  items:
    - key: {{ $ca.key | quote }}
      path: ca.crt
  defaultMode: 0440
{{- else }}
secret:
  {{- if eq $ca.source "secret" }}
  secretName: {{ $ca.name }}
  {{- else if .Values.certManager.enabled }}
  # The client CA's own Secret (its ca.crt is the CA certificate; the key is not projected).
  secretName: {{ include "slime.clientCAName" . }}
  {{- else }}
  secretName: {{ include "slime.apiserverClientName" . }}
  {{- end }}
  items:
    - key: {{ if eq $ca.source "secret" }}{{ $ca.key | quote }}{{ else }}ca.crt{{ end }}
      path: ca.crt
  defaultMode: 0440
{{- end }}
{{- end }}

{{/*
The scheduling gate that keeps every mirror pod unscheduled (common/names.py MIRROR_SCHEDULING_GATE).
*/}}
{{- define "slime.mirrorGate" -}}
slime/never-scheduled
{{- end }}
