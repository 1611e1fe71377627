# syntax=docker/dockerfile:1
# One image for both webhooks, `injection-webhook` (default CMD) and `scaling-webhook`, and the
# preflight check `slime-check` (the chart's `helm test` runs it).
#   docker build -t slime:dev .
#   docker run --rm slime:dev scaling-webhook --help
ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: resolve nothing, install exactly the hashed lock into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (cached layer): pinned and hashed; wheels only, so no compiler is needed.
COPY requirements.lock ./
RUN pip install --require-hashes --only-binary=:all: -r requirements.lock
# Then the project itself, without resolving dependencies again.
COPY pyproject.toml README.md* ./
COPY common ./common
COPY injection_webhook ./injection_webhook
COPY scaling_webhook ./scaling_webhook
COPY certs ./certs
COPY preflight ./preflight
COPY lifecycle ./lifecycle
RUN pip install --no-deps . \
 && python -c "import injection_webhook.main, scaling_webhook.main, preflight.main, lifecycle.teardown" \
 && test -x /opt/venv/bin/injection-webhook && test -x /opt/venv/bin/scaling-webhook \
 && test -x /opt/venv/bin/slime-check && test -x /opt/venv/bin/slime-teardown

# ---- runtime: the venv only; no build tools, no sources, non-root ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="slime" \
      org.opencontainers.image.description="SliMe admission webhooks (injection-webhook, scaling-webhook) and slime-check" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=builder /opt/venv /opt/venv
# 65532 = the "nonroot" user of distroless images; the chart runs with the same uid and a
# read-only root filesystem (writable /tmp is an emptyDir).
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT []
CMD ["injection-webhook"]
