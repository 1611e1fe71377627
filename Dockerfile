# syntax=docker/dockerfile:1
# One image for both webhooks, `injection-webhook` (default CMD) and `scaling-webhook`, the
# preflight check `slime-check` (the chart's `helm test` runs it), `slime-certgen` (the chart's
# certificate hook Jobs) and `slime-teardown` (its pre-delete hook Job).
#   podman build -t localhost/slime:0.2.0 .
#   podman run --rm localhost/slime:0.2.0 scaling-webhook --version
# Build arguments (docs/install.md, "The image" and "Air-gapped sites"):
#   PYTHON_IMAGE   the base of both stages; give it by digest (name@sha256:...) to pin it
#   PIP_INDEX_URL  the package index the hashed lock is installed from (a mirror of PyPI); every
#                  wheel is still checked against requirements.lock's sha256, whatever serves it
#   VERSION        must be the checkout's version (checked); the image's version label
#   REVISION       the git commit (git rev-parse HEAD): label, `--version`, logs, slime_build_info
#   SOURCE         where the source lives (a URL): the image's source label
# and one optional build secret, `pip_ca`: a PEM CA bundle pip trusts for PIP_INDEX_URL
# (`--secret id=pip_ca,src=/path/ca.pem`); a secret mount, so it never lands in a layer.
ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: resolve nothing, install exactly the hashed lock into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG VERSION=0.2.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (cached layer): pinned and hashed; wheels only, so no compiler is needed.
COPY requirements.lock ./
RUN --mount=type=secret,id=pip_ca,required=false \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && pip install --index-url "$PIP_INDEX_URL" --require-hashes --only-binary=:all: -r requirements.lock
# Then the project itself, without resolving dependencies again.
COPY pyproject.toml README.md* ./
COPY common ./common
COPY injection_webhook ./injection_webhook
COPY scaling_webhook ./scaling_webhook
COPY preflight ./preflight
COPY lifecycle ./lifecycle
# (Building it fetches setuptools from the same index: a mirror must serve it too.)
RUN --mount=type=secret,id=pip_ca,required=false \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
 && pip install --index-url "$PIP_INDEX_URL" --no-deps . \
 && python -c "import injection_webhook.main, scaling_webhook.main, preflight.main, lifecycle.certgen, lifecycle.teardown" \
 && test -x /opt/venv/bin/injection-webhook && test -x /opt/venv/bin/scaling-webhook \
 && test -x /opt/venv/bin/slime-check && test -x /opt/venv/bin/slime-certgen && test -x /opt/venv/bin/slime-teardown \
 && built="$(python -c 'from importlib.metadata import version; print(version("slime"))')" \
 && if [ "$built" != "$VERSION" ]; then echo "--build-arg VERSION=$VERSION, but the checkout is $built" >&2; exit 1; fi

# ---- runtime: the venv only; no build tools, no sources, non-root ----
FROM ${PYTHON_IMAGE}
ARG VERSION=0.2.0
ARG REVISION=unknown
ARG SOURCE=
COPY --from=builder /opt/venv /opt/venv
LABEL org.opencontainers.image.title="slime" \
      org.opencontainers.image.description="SliMe admission webhooks (injection-webhook, scaling-webhook), slime-check and slime-certgen" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
# SLIME_BUILD_REVISION: the commit, for --version, the first log line, slime_build_info and
# /version (common/version.py); the version itself comes from the installed package.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SLIME_BUILD_REVISION="${REVISION}"
# 65532 = the "nonroot" user of distroless images; the chart runs with the same uid and a
# read-only root filesystem (writable /tmp is an emptyDir).
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT []
CMD ["injection-webhook"]
