{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tandem.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tandem.serviceAccount" -}}
{{- default (include "tandem.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The rules reconcile uses in a watched namespace (tandem.operator.kinds.permissions). */}}
{{- define "tandem.rules" -}}
- apiGroups: [tandem.dev]
  resources: [llmdeployments]
  verbs: [list, watch, patch]
- apiGroups: [tandem.dev]
  resources: [llmdeployments/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps, persistentvolumeclaims, serviceaccounts, services]
  verbs: [create, patch, list, delete]
# the deployment's token: created once, never read (the operator can read no Secret)
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
# a failed model download's error is in its pods' termination messages
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, list, delete]
# the model cache's download Job, read before the Deployments are applied
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, create, patch, list, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch, list, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, patch, list, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, patch, list, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [create, patch, list, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [create, patch, list, delete]
# held so that the operator may grant it to each router (RBAC escalation prevention)
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list]
# held so that the operator may grant them to each SLO planner (the same prevention)
- apiGroups: [tandem.dev]
  resources: [llmdeployments]
  verbs: [get]
- apiGroups: [tandem.dev]
  resources: [llmdeployments/status]
  verbs: [get, update]
- apiGroups: [apps]
  resources: [deployments/scale]
  verbs: [get, patch, update]
- apiGroups: [""]
  resources: [pods]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}
