# syntax=docker/dockerfile:1
# podplacement: one image for the webhook and the controller (`podplacement webhook|controller`).
# Multi-arch, no architecture-specific step:
#   docker buildx build --platform linux/amd64,linux/arm64,linux/ppc64le,linux/s390x \
#     -t <registry>/podplacement:0.1.0 --push .
# The build stage has a C and Rust toolchain so that any dependency without a prebuilt wheel
# for the target architecture (cryptography, orjson, uvloop, ... on ppc64le or s390x) is
# compiled from source; where wheels exist pip uses them and the toolchain stays unused.
ARG PYTHON_IMAGE=python:3.11-slim-trixie

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential pkg-config libffi-dev libssl-dev cargo rustc \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/podplacement
ENV PATH=/opt/podplacement/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY podplacement ./podplacement
COPY webhook ./webhook
COPY controller ./controller
COPY imageinspect ./imageinspect
COPY certs ./certs
RUN pip install --upgrade pip setuptools wheel \
 && pip install . \
 && python -m compileall -q /opt/podplacement

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="podplacement" \
      org.opencontainers.image.description="Architecture- and NUMA-aware pod placement for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
# The root filesystem is read-only in deploy/: byte code was compiled in the build stage.
ENV PATH=/opt/podplacement/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/podplacement /opt/podplacement
USER 65532:65532
EXPOSE 9443 8080
ENTRYPOINT ["podplacement"]
CMD ["--help"]
