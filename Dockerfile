# syntax=docker/dockerfile:1
# The Tandem image: `tandem` as the entrypoint (`tandem router|prefill|decode|operator|serve`).
#
#   make image                                  # CPU, with the builder found on the machine
#   docker build -t tandem:0.1.0 .              # the same by hand (BuildKit)
#   docker build --build-arg VARIANT=cuda -t tandem:0.1.0-cuda .   # CUDA 13 torch and NIXL
#
# Layers, slowest first: the Python environment from the pinned lock (image/requirements-*.txt,
# rebuilt only when a pin changes), then the project's own wheel (seconds). Runs as uid 1000 with
# a read-only root filesystem: HOME, caches and temporary files live in /tmp, which the pods
# mount as an emptyDir. A proxy's CA bundle reaches pip as the build secret `ca` and is never
# written into a layer.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG VARIANT=cpu

FROM ${BASE_IMAGE} AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/tandem PATH=/opt/tandem/bin:/usr/local/bin:/usr/bin:/bin HOME=/tmp
RUN python3 -m venv /opt/tandem

# The CPU environment: torch's CPU build from the CPU index, or from a wheel in image/wheels/.
FROM base AS deps-cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY image/requirements-cpu.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca --mount=type=bind,source=image/wheels,target=/wheels \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install -q --no-deps --find-links /wheels \
      ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The CUDA environment: PyPI's torch (the CUDA 13 runtime as wheels) and NIXL built for CUDA 13.
FROM base AS deps-cuda
COPY image/requirements-cuda.txt /tmp/requirements.txt
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    pip install -q --no-deps -r /tmp/requirements.txt && rm /tmp/requirements.txt

# The project's wheel, built once from the sources alone (no tests, docs or benchmarks).
FROM deps-${VARIANT} AS wheel
COPY pyproject.toml README.md /src/
COPY cli /src/cli
COPY engine /src/engine
COPY node /src/node
COPY kernels /src/kernels
COPY prefill_node /src/prefill_node
COPY decode_node /src/decode_node
COPY router /src/router
COPY operator /src/operator
COPY sim /src/sim
COPY planner /src/planner
RUN pip wheel -q --no-deps --no-build-isolation -w /dist /src

# The image: the chosen environment, the project's wheel, a user to run as.
FROM deps-${VARIANT} AS tandem
COPY --from=wheel /dist /dist
# a passwd entry for uid 1000 (getpass, which kopf calls, asks who runs it)
RUN echo "tandem:x:1000:1000::/tmp:/usr/sbin/nologin" >>/etc/passwd \
    && echo "tandem:x:1000:" >>/etc/group \
    && pip install -q --no-deps /dist/*.whl && rm -rf /dist
USER 1000:1000
WORKDIR /tmp
# glibc's malloc asks for transparent huge pages where the kernel gives them on request
# (tandem.engine.api.huge_pages: the decode step 7-14% faster on the CPU)
ENV GLIBC_TUNABLES=glibc.malloc.hugetlb=1
ENTRYPOINT ["tandem"]
