# syntax=docker/dockerfile:1
# Fortis server image (issue 10): every service (`fortis serve --service NAME`) and the
# evaluation worker (`fortis worker`) from one image. Multi-stage: wheels are built and
# installed into a venv in the build stage; the runtime stage holds the venv, the Debian
# data Fortis reads offline, and nothing else. CPU torch only (pinned, as pyproject pins it).
# Runs as a non-root user and with a read-only root filesystem: state, caches and /tmp are
# volumes (the Helm chart mounts them).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Where the CPU build of torch comes from (a mirror or, in scripts/build_image.sh, a folder of
# wheels mounted into the build: PIP_FIND_LINKS). Only the +cpu build can satisfy the pin.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/fortis \
    && /opt/fortis/bin/pip install --index-url "${TORCH_INDEX_URL}" \
       --extra-index-url https://pypi.org/simple "torch==2.13.0+cpu"
COPY clients/python /src/clients/python
RUN /opt/fortis/bin/pip install /src/clients/python
COPY pyproject.toml setup.py README.md /src/
COPY services /src/services
COPY adapters /src/adapters
COPY clients/cli /src/clients/cli
RUN /opt/fortis/bin/pip install /src \
    && /opt/fortis/bin/pip install --no-deps "onnx2torch==1.5.15" \
    && /opt/fortis/bin/python -m compileall -q -x "torch/testing/_internal/py3" /opt/fortis/lib

FROM ${PYTHON_IMAGE} AS runtime
# Fashion-MNIST and the darknet test photos: the datasets of the built-in plans (Debian).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       dataset-fashion-mnist=0.0~git20200523.55506a9-1 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 fortis \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/fortis \
       --shell /usr/sbin/nologin fortis \
    && mkdir -p /var/lib/fortis /var/cache/fortis \
    && chown 10001:10001 /var/lib/fortis /var/cache/fortis
COPY --from=build /opt/fortis /opt/fortis
ENV PATH=/opt/fortis/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FORTIS_STATE=/var/lib/fortis \
    FORTIS_CACHE=/var/cache/fortis \
    HOME=/var/lib/fortis
# state (SQLite files when no database URL is given) and the models cache: volumes
VOLUME ["/var/lib/fortis", "/var/cache/fortis"]
USER 10001:10001
WORKDIR /var/lib/fortis
EXPOSE 50051
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["fortis", "health", "--address", "127.0.0.1:50051"]
ENTRYPOINT ["fortis"]
CMD ["serve", "--address", "0.0.0.0:50051", "--api-keys-file", "/etc/fortis/api-keys"]
