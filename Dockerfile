# muonbench in the NeMo container of the published runs (ships torch, Transformer Engine, Megatron-Core,
# Megatron-Bridge). Megatron-Core and Megatron-Bridge are replaced by the releases the recipes are written and tested
# against (MCORE_VERSION / BRIDGE_VERSION, recipes/versions.py CHECKED), installed with their requirements; every pip
# install runs under a constraints file frozen from the container itself, so torch / Transformer Engine (and every
# other package the container has) stay exactly as NVIDIA built them; a conflict stops the build.
#   make docker-build                      (linux/arm64 for GB300; PLATFORM=linux/amd64 for H100 / H200 nodes)
# MCORE_VERSION= / BRIDGE_VERSION= (empty) keep the container's own Megatron (the run's stack check then refuses it).
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:26.02
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
ARG GIT_SHA=""
# Megatron-Core pins Emerging-Optimizers v0.3.x: Megatron-Core HEAD imports a module EO main has moved, which
# silently disables the whole emerging-optimizer path.
ARG EO_VERSION=0.3.0
ARG MCORE_VERSION=0.19.2
ARG BRIDGE_VERSION=0.6.2

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/muonbench

# Dependencies first (cached while only sources change). The container's packages are frozen as constraints
# (Emerging-Optimizers, Megatron-Core and Megatron-Bridge excepted: pinned here); Megatron-Core and Megatron-Bridge
# with their requirements, then our light dependencies, added only where missing.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN pip list --format=freeze \
        | grep -v -i -E '^(emerging[-_]optimizers|megatron[-_]core|megatron[-_]bridge|muonbench)==' \
        > /tmp/container-constraints.txt \
    && if [ -n "${MCORE_VERSION}" ]; then \
        pip install --no-cache-dir -c /tmp/container-constraints.txt "megatron-core==${MCORE_VERSION}"; fi \
    && if [ -n "${BRIDGE_VERSION}" ]; then \
        pip install --no-cache-dir -c /tmp/container-constraints.txt "megatron-bridge==${BRIDGE_VERSION}"; fi \
    && pip install --no-cache-dir -c /tmp/container-constraints.txt \
        "emerging-optimizers==${EO_VERSION}" hydra-core omegaconf pandas matplotlib tqdm rich pyyaml

# Sources last; editable so conf/ next to the code is found; no dependency resolution.
COPY optim ./optim
COPY muonbench ./muonbench
COPY bench ./bench
COPY recipes ./recipes
COPY experiments ./experiments
COPY conf ./conf
COPY Makefile README.md ./
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
    && BASE_IMAGE="${BASE_IMAGE}" GIT_SHA="${GIT_SHA}" python -m recipes.versions /opt/muonbench/versions.json

ENV MUONBENCH_VERSIONS=/opt/muonbench/versions.json
