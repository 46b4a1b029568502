{{/* Fortis chart helpers (issue 10). */}}

{{- define "fortis.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "fortis.labels" -}}
app.kubernetes.io/name: fortis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* selector labels of one component: (dict "root" $ "component" "proxy") */}}
{{- define "fortis.selector" -}}
app.kubernetes.io/name: fortis
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "fortis.image" -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}

{{/* dns:/// address of a component's headless Service: (dict "root" $ "component" "proxy") */}}
{{- define "fortis.address" -}}
{{- printf "dns:///%s-%s.%s.svc.cluster.local:%v" (include "fortis.fullname" .root) .component .root.Release.Namespace .root.Values.grpcPort -}}
{{- end -}}

{{- define "fortis.serviceAccount" -}}
{{- include "fortis.fullname" . -}}
{{- end -}}

{{- define "fortis.workerServiceAccount" -}}
{{- printf "%s-worker" (include "fortis.fullname" .) -}}
{{- end -}}

{{/* The checks every render makes: settings that cannot work together fail here, named. */}}
{{- define "fortis.validate" -}}
{{- $v := .Values -}}
{{- if not $v.secrets.apiKeys.existingSecret -}}
{{- fail "secrets.apiKeys.existingSecret is required: a secret with the tenant's API keys ('TENANT sha256:<hex>' lines, fortis keys new)" -}}
{{- end -}}
{{- if not $v.secrets.internalKey.existingSecret -}}
{{- fail "secrets.internalKey.existingSecret is required: the key the services call each other with" -}}
{{- end -}}
{{- if and (gt (int $v.proxy.replicas) 1) (not $v.secrets.redis.existingSecret) -}}
{{- fail "proxy.replicas > 1 needs secrets.redis.existingSecret: without Redis each replica would enforce rate limits and budgets on its own" -}}
{{- end -}}
{{- if and (gt (int $v.evaluation.replicas) 1) (not $v.secrets.database.existingSecret) -}}
{{- fail "evaluation.replicas > 1 needs secrets.database.existingSecret (SQLite state is one pod's)" -}}
{{- end -}}
{{- if and (eq $v.evaluation.executor "kubernetes") (not $v.secrets.database.existingSecret) -}}
{{- fail "evaluation.executor kubernetes needs secrets.database.existingSecret: worker pods share the evaluation store" -}}
{{- end -}}
{{- if $v.networkPolicy.enabled -}}
{{- if and $v.secrets.database.existingSecret (not $v.networkPolicy.database.to) -}}
{{- fail "networkPolicy.database.to is required with secrets.database (where PostgreSQL is reached)" -}}
{{- end -}}
{{- if and $v.secrets.redis.existingSecret (not $v.networkPolicy.redis.to) -}}
{{- fail "networkPolicy.redis.to is required with secrets.redis (where Redis is reached)" -}}
{{- end -}}
{{- if and (eq $v.evaluation.executor "kubernetes") (not $v.networkPolicy.kubernetesApi.to) -}}
{{- fail "networkPolicy.kubernetesApi.to is required with evaluation.executor kubernetes (where the API server is reached)" -}}
{{- end -}}
{{- if and (include "fortis.tracingEndpoint" .) (not $v.tracing.networkPolicyTo) -}}
{{- fail "tracing.networkPolicyTo is required with an OTEL_EXPORTER_OTLP_*ENDPOINT in tracing.env and networkPolicy.enabled (where the collector is reached)" -}}
{{- end -}}
{{- range $v.targets -}}
{{- if and .address (not .networkPolicyTo) -}}
{{- fail (printf "targets[%s].networkPolicyTo is required with networkPolicy.enabled (where the target is reached)" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if $v.identity.tlsTenantFrom -}}
{{- if not $v.secrets.tls.existingSecret -}}
{{- fail "identity.tlsTenantFrom needs secrets.tls.existingSecret with clientAuth: require (only a verified client certificate may name a tenant)" -}}
{{- end -}}
{{- if ne $v.secrets.tls.clientAuth "require" -}}
{{- fail "identity.tlsTenantFrom needs secrets.tls.clientAuth: require (only a verified client certificate may name a tenant)" -}}
{{- end -}}
{{- end -}}
{{- $names := list "*" -}}
{{- range $v.targets }}{{ $names = append $names .name }}{{ end -}}
{{- range $v.whiteboxGrants -}}
{{- if not (has .target $names) -}}
{{- fail (printf "whiteboxGrants: tenant %s is granted target '%s', which is not in targets (give a target's name, or \"*\")" .tenant .target) -}}
{{- end -}}
{{- end -}}
{{- if $v.networkPolicy.enabled -}}
{{- range $v.identity.oidc.issuers -}}
{{- if not .networkPolicyTo -}}
{{- fail (printf "identity.oidc.issuers[%s].networkPolicyTo is required with networkPolicy.enabled (where its JWKS is fetched from)" .url) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $v.targets -}}
{{- if and .address .builtin -}}
{{- fail (printf "targets[%s]: give address or builtin, not both" .name) -}}
{{- end -}}
{{- if not (or .address .builtin) -}}
{{- fail (printf "targets[%s]: address (HOST:PORT) or builtin (a model name) is required" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* --target spec of one target (the proxy's flag syntax). */}}
{{- define "fortis.targetSpec" -}}
{{- $q := list -}}
{{- if .rate }}{{ $q = append $q (printf "rate=%v" .rate) }}{{ end -}}
{{- if .tenants }}{{ $q = append $q (printf "tenants=%s" (join "," .tenants)) }}{{ end -}}
{{- if .builtin -}}
{{- if .output }}{{ $q = append $q (printf "output=%s" .output) }}{{ end -}}
{{- printf "%s=builtin:%s" .name .builtin -}}
{{- else if .tls -}}
{{- $dir := printf "/etc/fortis/targets/%s" .name -}}
{{- if .credentialsSecret }}{{ $q = append $q (printf "ca=%s/ca.crt" $dir) }}{{ end -}}
{{- if .clientCertificate }}{{ $q = append $q (printf "cert=%s/tls.crt&key=%s/tls.key" $dir $dir) }}{{ end -}}
{{- if .serverName }}{{ $q = append $q (printf "server_name=%s" .serverName) }}{{ end -}}
{{- printf "%s=grpcs://%s" .name .address -}}
{{- else -}}
{{- printf "%s=grpc://%s" .name .address -}}
{{- end -}}
{{- if $q }}?{{ join "&" $q }}{{ end -}}
{{- end -}}

{{/* --oidc-issuer spec of one issuer: URL,audience=A[,audience=B],tenant-claim=C[,tenants=T1:T2]
     [,tenant-prefix=P][,jwks-url=U]
     [,ca-file=F][,algorithms=A:B][,leeway=S] (dict "issuer" $iss "index" $i). */}}
{{- define "fortis.oidcIssuerSpec" -}}
{{- $iss := .issuer -}}
{{- $q := list $iss.url -}}
{{- range $iss.audiences }}{{ $q = append $q (printf "audience=%s" .) }}{{ end -}}
{{- $q = append $q (printf "tenant-claim=%s" $iss.tenantClaim) -}}
{{- with $iss.tenants }}{{ $q = append $q (printf "tenants=%s" (join ":" .)) }}{{ end -}}
{{- with $iss.tenantPrefix }}{{ $q = append $q (printf "tenant-prefix=%s" .) }}{{ end -}}
{{- with $iss.jwksUrl }}{{ $q = append $q (printf "jwks-url=%s" .) }}{{ end -}}
{{- if $iss.caConfigMap }}{{ $q = append $q (printf "ca-file=/etc/fortis/oidc/%v/ca.crt" .index) }}{{ end -}}
{{- with $iss.algorithms }}{{ $q = append $q (printf "algorithms=%s" (join ":" .)) }}{{ end -}}
{{- if hasKey $iss "leewaySeconds" }}{{ $q = append $q (printf "leeway=%v" $iss.leewaySeconds) }}{{ end -}}
{{- join "," $q -}}
{{- end -}}

{{/* Non-empty when tracing.env names an OTLP endpoint (the pods then reach a collector). */}}
{{- define "fortis.tracingEndpoint" -}}
{{- range $k, $_ := .Values.tracing.env -}}
{{- if and (hasPrefix "OTEL_EXPORTER_OTLP_" $k) (hasSuffix "ENDPOINT" $k) -}}yes{{- end -}}
{{- end -}}
{{- end -}}
