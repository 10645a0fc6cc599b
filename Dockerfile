# syntax=docker/dockerfile:1
# Two images from one recipe (see deploy/kubernetes/):
#   docker build --target webhook -t ghcr.io/gpuflame/gpuflame-webhook:0.1.0 .
#   docker build --target payload -t ghcr.io/gpuflame/gpuflame-payload:0.1.0 .
#   docker build --target agent -t ghcr.io/gpuflame/gpuflame-agent:0.1.0 .   (the node agent)
# webhook: `gpuflame webhook`, the mutating admission webhook (HTTPS on 8443).
# payload: the init container the webhook adds to annotated pods; it runs
#          `gpuflame-payload-install /gpuflame` to copy gpuflame into the pod's
#          shared emptyDir, from where the workload's own Python imports it.
# Both run as the non-root user 65532 and work with a read-only root filesystem.

ARG PYTHON_VERSION=3.12

# --- bpf: the node agent's BPF object, compiled once (CO-RE) -----------------
# clang against a vmlinux.h dumped from the build machine's kernel BTF; libbpf
# relocates it to each node's kernel at load time, so nothing is compiled on a node.
FROM python:${PYTHON_VERSION}-slim AS bpf
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang llvm libbpf-dev bpftool \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY src/gpuflame/agent/build.py src/gpuflame/agent/build.py
COPY src/gpuflame/agent/bpf src/gpuflame/agent/bpf
RUN python src/gpuflame/agent/build.py

# --- builder: a wheel of gpuflame and wheels of its dependencies -------------
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY --from=bpf /src/src/gpuflame/agent/bpf/agent.bpf.o ./src/gpuflame/agent/bpf/agent.bpf.o
RUN pip wheel --wheel-dir /wheels .

# --- common runtime: slim Python, gpuflame installed, non-root ---------------
FROM python:${PYTHON_VERSION}-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN groupadd --system --gid 65532 gpuflame \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin gpuflame
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels gpuflame \
 && python -m compileall -q "$(python -c 'import gpuflame, os; print(os.path.dirname(gpuflame.__file__))')"
LABEL org.opencontainers.image.source="https://github.com/gpuflame/gpuflame" \
      org.opencontainers.image.licenses="Apache-2.0"

# --- payload: the init container's image -------------------------------------
FROM runtime AS payload
USER 65532:65532
ENTRYPOINT ["gpuflame-payload-install"]
CMD ["/gpuflame"]

# --- agent: `gpuflame agent`, the node agent's DaemonSet (overlays/agent) ----
# uid 0 with the capabilities BPF, PERFMON and SYS_PTRACE given by the pod
# (Kubernetes adds no ambient capabilities to a non-root user); libbpf1 loads
# the object the wheel carries.
FROM runtime AS agent
RUN apt-get update \
 && apt-get install -y --no-install-recommends libbpf1 \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["gpuflame"]
CMD ["agent"]

# --- webhook: the admission webhook (last stage, so a plain build makes it) --
FROM runtime AS webhook
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpuflame"]
CMD ["webhook", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key", "--port", "8443"]
