{{/* One service's Deployment (issue 10): fortis serve --service NAME, restricted security
     context, gRPC probes, state/cache/tmp on volumes (read-only root filesystem).
     Called as (dict "root" $ "component" "proxy"). */}}
{{- define "fortis.deployment" -}}
{{- $root := .root -}}
{{- $c := .component -}}
{{- $v := $root.Values -}}
{{- $cv := index $v $c -}}
{{- $full := include "fortis.fullname" $root -}}
{{- $tls := $v.secrets.tls.existingSecret -}}
{{- $kube := and (eq $c "evaluation") (eq $v.evaluation.executor "kubernetes") -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $full }}-{{ $c }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "fortis.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ $c }}
spec:
  {{- if not (and (eq $c "perturbation") $v.perturbation.autoscaling.enabled) }}
  replicas: {{ $cv.replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  {{- if and (eq $c "evaluation") $v.evaluation.persistence.enabled }}
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "fortis.selector" (dict "root" $root "component" $c) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "fortis.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $c }}
        {{- with $v.serviceAccount.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      annotations:
        checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "fortis.serviceAccount" $root }}
      automountServiceAccountToken: {{ $kube }}
      terminationGracePeriodSeconds: {{ add (int $v.shutdownGraceSeconds) 8 }}
      securityContext:
        {{- toYaml $v.podSecurityContext | nindent 8 }}
      {{- with $v.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: {{ $c }}
          image: {{ include "fortis.image" $root }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            - serve
            - --service={{ $c }}
            - --address=0.0.0.0:{{ $v.grpcPort }}
            - --state-dir=/var/lib/fortis
            - --api-keys-file=/etc/fortis/api-keys/{{ $v.secrets.apiKeys.key }}
            - --metrics-address=0.0.0.0:{{ $v.metricsPort }}
            - --shutdown-grace={{ $v.shutdownGraceSeconds }}
            - --log-level={{ $v.logLevel }}
            - --max-calls-per-tenant=$(FORTIS_MAX_CALLS_PER_TENANT)
            - --max-call-rate-per-tenant=$(FORTIS_MAX_CALL_RATE_PER_TENANT)
            {{- if not (kindIs "invalid" $v.limits.workSlots) }}
            - --work-slots=$(FORTIS_WORK_SLOTS)
            {{- end }}
            - --server-workers=$(FORTIS_SERVER_WORKERS)
            - --max-request-decoded-bytes=$(FORTIS_MAX_REQUEST_DECODED_BYTES)
            - --max-tenant-decoded-bytes=$(FORTIS_MAX_TENANT_DECODED_BYTES)
            {{- /* identity: every service authenticates its own callers */}}
            {{- range $i, $_ := $v.identity.oidc.issuers }}
            - --oidc-issuer=$(FORTIS_OIDC_ISSUER_{{ $i }})
            {{- end }}
            {{- if $v.identity.tlsTenantFrom }}
            - --tls-tenant-from=$(FORTIS_TLS_TENANT_FROM)
            {{- end }}
            {{- range $i, $_ := keys $v.limits.tenantQuotas }}
            - --tenant-quota=$(FORTIS_TENANT_QUOTA_{{ $i }})
            {{- end }}
            {{- /* the services the evaluation (and the others') calls reach: fortis serve has
                   no --evaluation-address, nothing calls the evaluation service internally */}}
            {{- range $o := list "perturbation" "proxy" "scoring" "report" }}
            {{- if ne $o $c }}
            - --{{ $o }}-address={{ include "fortis.address" (dict "root" $root "component" $o) }}
            {{- end }}
            {{- end }}
            {{- if $tls }}
            - --tls-cert=/etc/fortis/tls/tls.crt
            - --tls-key=/etc/fortis/tls/tls.key
            - --tls-ca=/etc/fortis/tls/ca.crt
            - --tls-client-auth={{ $v.secrets.tls.clientAuth }}
            {{- with $v.secrets.tls.serverName }}
            - --tls-server-name={{ . }}
            {{- end }}
            {{- end }}
            {{- if eq $c "proxy" }}
            - --no-default-targets
            - --max-queries-per-day-per-tenant=$(FORTIS_MAX_QUERIES_PER_DAY_PER_TENANT)
            {{- range $i, $_ := $v.targets }}
            - --target=$(FORTIS_TARGET_{{ $i }})
            {{- end }}
            {{- range $i, $_ := keys $v.limits.tenantRates }}
            - --tenant-rate=$(FORTIS_TENANT_RATE_{{ $i }})
            {{- end }}
            {{- end }}
            {{- if eq $c "perturbation" }}
            {{- /* which targets serve each built-in model, this pod asks the proxy over its
                   contract (GetBuiltinTargets, with the internal key) */}}
            {{- range $i, $_ := $v.whiteboxGrants }}
            - --whitebox-grant=$(FORTIS_WHITEBOX_GRANT_{{ $i }})
            {{- end }}
            {{- end }}
            {{- if eq $c "evaluation" }}
            - --max-running-per-tenant=$(FORTIS_MAX_RUNNING_PER_TENANT)
            - --max-queued-per-tenant=$(FORTIS_MAX_QUEUED_PER_TENANT)
            - --evaluation-workers=$(FORTIS_EVALUATION_WORKERS)
            - --upload-quota-bytes=$(FORTIS_UPLOAD_QUOTA_BYTES)
            - --executor={{ $v.evaluation.executor }}
            {{- with $v.evaluation.dataRoot }}
            - --data-root={{ . }}
            {{- end }}
            {{- if $kube }}
            - --job-image={{ default (include "fortis.image" $root) $v.evaluation.jobs.image }}
            - --job-shards={{ $v.evaluation.jobs.shards }}
            - --job-service-account={{ include "fortis.workerServiceAccount" $root }}
            - --job-secret-env=FORTIS_DATABASE_URL={{ $v.secrets.database.existingSecret }}:{{ $v.secrets.database.key }}
            - --job-secret-env=FORTIS_INTERNAL_KEY={{ $v.secrets.internalKey.existingSecret }}:{{ $v.secrets.internalKey.key }}
            {{- with $v.tracing.headersSecret.existingSecret }}
            - --job-secret-env=OTEL_EXPORTER_OTLP_HEADERS={{ . }}:{{ $v.tracing.headersSecret.key }}
            {{- end }}
            {{- if $tls }}
            {{- /* the worker pods mount the same secret and call the services over mTLS */}}
            - --job-tls-secret={{ $tls }}
            {{- end }}
            {{- end }}
            {{- end }}
            {{- range $cv.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          envFrom:
            - configMapRef:
                name: {{ $full }}-config
          env:
            - name: FORTIS_INTERNAL_KEY
              valueFrom:
                secretKeyRef:
                  name: {{ $v.secrets.internalKey.existingSecret }}
                  key: {{ $v.secrets.internalKey.key }}
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            {{- /* tracing: the OTEL_* variables (docs/tracing.md); none set, no tracing */}}
            {{- range $k, $val := $v.tracing.env }}
            - name: {{ $k }}
              value: {{ $val | quote }}
            {{- end }}
            {{- if and $v.tracing.env (not (hasKey $v.tracing.env "OTEL_SERVICE_NAME")) }}
            - name: OTEL_SERVICE_NAME
              value: fortis-{{ $c }}
            {{- end }}
            {{- with $v.tracing.headersSecret.existingSecret }}
            - name: OTEL_EXPORTER_OTLP_HEADERS
              valueFrom:
                secretKeyRef:
                  name: {{ . }}
                  key: {{ $v.tracing.headersSecret.key }}
            {{- end }}
            {{- if and $v.secrets.database.existingSecret (has $c (list "evaluation" "perturbation" "proxy")) }}
            - name: FORTIS_DATABASE_URL
              valueFrom:
                secretKeyRef:
                  name: {{ $v.secrets.database.existingSecret }}
                  key: {{ $v.secrets.database.key }}
            {{- end }}
            {{- if and $v.secrets.redis.existingSecret (eq $c "proxy") }}
            - name: FORTIS_REDIS_URL
              valueFrom:
                secretKeyRef:
                  name: {{ $v.secrets.redis.existingSecret }}
                  key: {{ $v.secrets.redis.key }}
            {{- end }}
          ports:
            - name: grpc
              containerPort: {{ $v.grpcPort }}
              protocol: TCP
            - name: metrics
              containerPort: {{ $v.metricsPort }}
              protocol: TCP
          {{- range $kind := list "startup" "readiness" "liveness" }}
          {{ $kind }}Probe:
            {{- if $tls }}
            exec:
              command:
                - fortis
                - health
                - --address=127.0.0.1:{{ $v.grpcPort }}
                - --tls-ca=/etc/fortis/tls/ca.crt
                - --tls-cert=/etc/fortis/tls/tls.crt
                - --tls-key=/etc/fortis/tls/tls.key
                - --tls-server-name={{ default (printf "%s-%s.%s.svc.cluster.local" $full $c $root.Release.Namespace) $v.secrets.tls.serverName }}
            {{- else }}
            grpc:
              port: {{ $v.grpcPort }}
            {{- end }}
            {{- toYaml (index $v.probes $kind) | nindent 12 }}
          {{- end }}
          resources:
            {{- toYaml $cv.resources | nindent 12 }}
          securityContext:
            {{- toYaml $v.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
            - {name: cache, mountPath: /var/cache/fortis}
            - {name: state, mountPath: /var/lib/fortis}
            - {name: api-keys, mountPath: /etc/fortis/api-keys, readOnly: true}
            {{- if $tls }}
            - {name: tls, mountPath: /etc/fortis/tls, readOnly: true}
            {{- end }}
            {{- range $i, $iss := $v.identity.oidc.issuers }}
            {{- if $iss.caConfigMap }}
            - {name: oidc-ca-{{ $i }}, mountPath: /etc/fortis/oidc/{{ $i }}, readOnly: true}
            {{- end }}
            {{- end }}
            {{- if eq $c "proxy" }}
            {{- range $v.targets }}
            {{- if .credentialsSecret }}
            - {name: target-{{ .name }}, mountPath: /etc/fortis/targets/{{ .name }}, readOnly: true}
            {{- end }}
            {{- end }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {sizeLimit: {{ $v.tmpSize }}}
        - name: cache
          emptyDir: {sizeLimit: {{ $v.cacheSize }}}
        - name: state
          {{- if and (eq $c "evaluation") $v.evaluation.persistence.enabled }}
          persistentVolumeClaim:
            claimName: {{ $full }}-evaluation-state
          {{- else }}
          emptyDir: {}
          {{- end }}
        - name: api-keys
          secret:
            secretName: {{ $v.secrets.apiKeys.existingSecret }}
            items: [{key: {{ $v.secrets.apiKeys.key }}, path: {{ $v.secrets.apiKeys.key }}}]
        {{- if $tls }}
        - name: tls
          secret:
            secretName: {{ $tls }}
        {{- end }}
        {{- range $i, $iss := $v.identity.oidc.issuers }}
        {{- if $iss.caConfigMap }}
        - name: oidc-ca-{{ $i }}
          configMap:
            name: {{ $iss.caConfigMap }}
            items: [{key: {{ default "ca.crt" $iss.caKey }}, path: ca.crt}]
        {{- end }}
        {{- end }}
        {{- if eq $c "proxy" }}
        {{- range $v.targets }}
        {{- if .credentialsSecret }}
        - name: target-{{ .name }}
          secret:
            secretName: {{ .credentialsSecret }}
        {{- end }}
        {{- end }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
