# syntax=docker/dockerfile:1
# Two images from one recipe (see deploy/kubernetes/):
#   docker build --target webhook -t ghcr.io/gpuflame/gpuflame-webhook:0.1.0 .
#   docker build --target payload -t ghcr.io/gpuflame/gpuflame-payload:0.1.0 .
# webhook: `gpuflame webhook`, the mutating admission webhook (HTTPS on 8443).
# payload: the init container the webhook adds to annotated pods; it runs
#          `gpuflame-payload-install /gpuflame` to copy gpuflame into the pod's
#          shared emptyDir, from where the workload's own Python imports it.
# Both run as the non-root user 65532 and work with a read-only root filesystem.

ARG PYTHON_VERSION=3.12

# --- builder: a wheel of gpuflame and wheels of its dependencies -------------
FROM python:${PYTHON_VERSION}-slim AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
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

# --- webhook: the admission webhook (last stage, so a plain build makes it) --
FROM runtime AS webhook
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["gpuflame"]
CMD ["webhook", "--tls-cert", "/tls/tls.crt", "--tls-key", "/tls/tls.key", "--port", "8443"]
