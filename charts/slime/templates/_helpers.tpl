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

{{/* Sorted unique namespaces of the MachineDeployments (+ scaling.extraNamespaces), JSON list. */}}
{{- define "slime.mdNamespaces" -}}
{{- $ns := list }}
{{- range .Values.scaling.mappings }}
{{- $ns = append $ns .machineDeployment.namespace }}
{{- end }}
{{- $ns = concat $ns .Values.scaling.extraNamespaces }}
{{- toJson ($ns | uniq | sortAlpha) }}
{{- end }}

{{/* Sorted unique namespaces of the mirrors (+ scaling.extraNamespaces), JSON list. */}}
{{- define "slime.mirrorNamespaces" -}}
{{- $ns := list }}
{{- range .Values.scaling.mappings }}
{{- $ns = append $ns .mirror.namespace }}
{{- end }}
{{- $ns = concat $ns .Values.scaling.extraNamespaces }}
{{- toJson ($ns | uniq | sortAlpha) }}
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
{{- $live = not (empty (lookup "v1" "ServiceAccount" $root.Release.Namespace "default")) }}
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
The list items of the scaling ConfigMap, as JSON, after checking the mappings:
- two mappings may not share a mirror Deployment, nor a MachineDeployment (one writer each);
- maxReplicas: the mapping's explicit `maxReplicas`, else its KEDA maxReplicaCount when KEDA
  scales it, else absent; an explicit value above the KEDA maximum fails.
*/}}
{{- define "slime.mappingItems" -}}
{{- $root := . }}
{{- $items := list }}
{{- $mds := dict }}
{{- $mirrors := dict }}
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
