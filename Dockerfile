# muonbench in the NeMo container of the published runs (ships torch, Transformer Engine, Megatron-Core,
# Megatron-Bridge). Nothing the container already has is replaced: every pip install runs under a constraints
# file frozen from the container itself, so torch / TE / Megatron stay exactly as NVIDIA built them.
#   docker build --build-arg GIT_SHA="$(git rev-parse HEAD)" -t muonbench:26.02 .
# To run the Megatron releases the offline recipe tests check (megatron-core 0.19.2, megatron-bridge 0.6.2) instead
# of the container's, add --build-arg MCORE_VERSION=0.19.2 --build-arg BRIDGE_VERSION=0.6.2 (installed --no-deps).
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:26.02
FROM ${BASE_IMAGE}

ARG BASE_IMAGE
ARG GIT_SHA=""
# Megatron-Core pins Emerging-Optimizers v0.3.x: Megatron-Core HEAD imports a module EO main has moved, which
# silently disables the whole emerging-optimizer path.
ARG EO_VERSION=0.3.0
ARG MCORE_VERSION=""
ARG BRIDGE_VERSION=""

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/muonbench

# Dependencies first (cached while only sources change). The container's packages are frozen as constraints
# (Emerging-Optimizers excepted: we pin it); our light dependencies are added only where missing.
COPY pyproject.toml ./
# hadolint ignore=DL3013
RUN pip list --format=freeze | grep -v -i -E '^(emerging[-_]optimizers|muonbench)==' > /tmp/container-constraints.txt \
    && pip install --no-cache-dir -c /tmp/container-constraints.txt \
        "emerging-optimizers==${EO_VERSION}" hydra-core omegaconf pandas matplotlib tqdm rich pyyaml \
    && if [ -n "${MCORE_VERSION}" ]; then pip install --no-cache-dir --no-deps "megatron-core==${MCORE_VERSION}"; fi \
    && if [ -n "${BRIDGE_VERSION}" ]; then pip install --no-cache-dir --no-deps "megatron-bridge==${BRIDGE_VERSION}"; fi

# Sources last; editable so conf/ next to the code is found; no dependency resolution.
COPY optim ./optim
COPY config ./config
COPY bench ./bench
COPY recipes ./recipes
COPY tools ./tools
COPY experiments ./experiments
COPY conf ./conf
COPY Makefile README.md ./
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
    && BASE_IMAGE="${BASE_IMAGE}" GIT_SHA="${GIT_SHA}" python -m recipes.versions /opt/muonbench/versions.json

ENV MUONBENCH_VERSIONS=/opt/muonbench/versions.json
