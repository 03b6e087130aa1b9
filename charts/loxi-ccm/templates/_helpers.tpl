{{/*
Names. Every object is named after the chart (loxi-ccm) unless fullnameOverride says
otherwise: the controller's Lease, its RBAC and its ConfigMap are one per cluster, so the
release name is not part of them.
*/}}
{{- define "loxi-ccm.fullname" -}}
{{- .Values.fullnameOverride | default "loxi-ccm" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The selector labels: never change after the first install (a Deployment's selector is immutable). */}}
{{- define "loxi-ccm.selectorLabels" -}}
app.kubernetes.io/name: loxi-ccm
{{- end -}}

{{/*
Labels on every object. The Helm bookkeeping labels are left out when the chart renders the
plain manifests of deploy/ (helmManaged: false), which are applied with kubectl.
*/}}
{{- define "loxi-ccm.labels" -}}
{{ include "loxi-ccm.selectorLabels" . }}
{{- if .Values.helmManaged }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Name of the Secret holding the loxilb token: an existing one, or the chart's. */}}
{{- define "loxi-ccm.tokenSecret" -}}
{{- .Values.loxilb.existingSecret | default (printf "%s-loxilb-auth" (include "loxi-ccm.fullname" .)) -}}
{{- end -}}

{{/* Namespace of the leader-election Lease (and of the Role that grants it). */}}
{{- define "loxi-ccm.leaseNamespace" -}}
{{- .Values.leaderElection.namespace | default .Release.Namespace -}}
{{- end -}}

{{/*
The loxilb API URLs, comma-separated: loxilb.urls, then one URL per replica of an in-cluster
loxilb StatefulSet (its Pods have stable DNS names through the headless Service).
*/}}
{{- define "loxi-ccm.loxilbURLs" -}}
{{- $urls := list -}}
{{- range .Values.loxilb.urls -}}
{{- $urls = append $urls . -}}
{{- end -}}
{{- $ic := .Values.loxilb.inCluster -}}
{{- if $ic.enabled -}}
{{- $ns := $ic.namespace | default .Release.Namespace -}}
{{- range $i := until (int $ic.replicas) -}}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:%d" $ic.scheme $ic.statefulSet $i $ic.service $ns (int $ic.port)) -}}
{{- end -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* Whether extraArgs name the loxilb URL themselves (kube-loxilb's --loxiURL or ours). */}}
{{- define "loxi-ccm.urlInArgs" -}}
{{- range .Values.extraArgs -}}
{{- if or (hasPrefix "--loxiURL" .) (hasPrefix "--loxilb-url" .) (hasPrefix "-loxiURL" .) -}}yes{{- end -}}
{{- end -}}
{{- end -}}
