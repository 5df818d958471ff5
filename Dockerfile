# edgetpu-serve for x86-64 hosts with a Coral USB Accelerator (an M.2/PCIe TPU works too).
# docker/devboard.Dockerfile is the same recipe with the Dev Board's defaults; docs/images.md
# says how to build both offline and run them.
#
#   make images                      # docker/tools/images.sh: base, wheelhouse, checked runtime files
#   docker run --rm --network=host -v /dev/bus/usb:/dev/bus/usb --device-cgroup-rule='c 189:* rmw' \
#       --group-add "$(getent group plugdev | cut -d: -f3)" edgetpu-serve:latest
# (the bus bind-mounted, not --device: the USB Accelerator comes back on a new node after its first use)
#
# The build context is not this checkout but the one docker/tools/context.py assembles: app/,
# converter/, models/, docker/ files, wheelhouse/<arch> (wheels of docker/requirements.lock) and
# runtime/ (the Edge TPU files only GitHub releases and Coral host, sha256-checked against
# app/edgetpu/versions.toml). Every step runs with --network=none.
#
# Stages: `site` installs the wheels for the target's architecture (on the build machine: no
# pip under QEMU); `models` runs edgetpu_compiler, which exists for x86-64 only, over every
# model directory when runtime/ holds it; the image itself is Debian bookworm's Python 3.11
# with those, libedgetpu when runtime/ holds it, and the service.
ARG BASE_IMAGE=edgetpu-serve-base:bookworm-amd64
ARG BUILD_BASE_IMAGE=edgetpu-serve-base:bookworm-amd64

FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS site
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TARGETARCH
COPY docker/requirements.lock docker/tools/platforms.sh /build/
COPY wheelhouse/${TARGETARCH} /wheels
# pip installs another architecture's wheels with --target and the platform flags: unpacking only.
# (The flags are single words: split on purpose.)
# hadolint ignore=SC2046
RUN python3 -m venv /opt/pip \
    && . /build/platforms.sh \
    && /opt/pip/bin/pip install --quiet --no-cache-dir --disable-pip-version-check --no-index --find-links /wheels \
       --require-hashes $(pip_platform_flags "${TARGETARCH}") --target /opt/site -r /build/requirements.lock

FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS models
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG BUILDARCH
COPY runtime /runtime
COPY wheelhouse /wheelhouse
COPY docker/requirements.lock /build/
COPY app /src/app
COPY converter /src/converter
COPY models /src/models
# Copied in the same step as the compiles: the converter swaps a model directory by renaming it,
# which overlayfs refuses (EXDEV) for a directory of an earlier layer.
# Exit status 3 of `converter compile`: compiled, with some operators left on the CPU.
RUN cp -a /src/models /models || exit 1; \
    set -- /runtime/edgetpu-compiler_*_amd64.deb; \
    if [ ! -e "$1" ]; then \
        echo "no edgetpu_compiler in runtime/: the models stay CPU-only (no *_edgetpu.tflite)"; exit 0; \
    fi \
    && dpkg -i "$@" \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --quiet --no-cache-dir --disable-pip-version-check --no-index \
       --find-links "/wheelhouse/${BUILDARCH}" --require-hashes -r /build/requirements.lock \
    && for model in /models/*/; do \
        PYTHONPATH=/src /opt/venv/bin/python -m converter compile "${model}" || [ $? -eq 3 ] || exit 1; \
    done

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG TARGETARCH
# libedgetpu's max flavor asks to accept its EULA through debconf.
# plugdev (gid 46 on Debian and Ubuntu hosts) owns the USB Accelerator's nodes under the
# udev rules in docs/images.md; another host gid: docker run --group-add <gid>.
RUN --mount=type=bind,source=runtime,target=/runtime \
    python3 -m venv --without-pip /opt/venv \
    && set -- /runtime/libedgetpu1-*_"${TARGETARCH}".deb \
    && if [ -e "$1" ]; then \
        echo "libedgetpu1-max libedgetpu/accepted-eula boolean true" | debconf-set-selections \
        && DEBIAN_FRONTEND=noninteractive dpkg -i "$@"; \
    else echo "no libedgetpu in runtime/: a CPU and emulator image (/v1/devices says why there is no TPU)"; fi \
    && groupadd --system --gid 10001 edgetpu \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --groups plugdev edgetpu \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/edgetpu-serve
COPY --from=site /opt/site /opt/venv/lib/python3.11/site-packages
COPY docker/clone3_enosys.py /usr/local/lib/edgetpu-serve/clone3_enosys.py
WORKDIR /srv/edgetpu-serve
COPY app ./app
# Baked default models (compiled for the Edge TPU when the build had the compiler); mount your
# own over /models.
COPY --from=models /models /models
# BACKENDS=edgetpu,cpu with EDGETPU_ON_FAILURE=fallback: with a TPU, libedgetpu and a compiled
# model a model runs on the TPU; without any of them it is served on the CPU, /readyz answers
# 200 "degraded" with the reason and the fix, and /v1/devices says why the TPU is unused.
# EDGETPU_SERVE_EDGETPU_ON_FAILURE=fail makes a missing TPU stop the container instead.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGETPU_SERVE_HOST=0.0.0.0 \
    EDGETPU_SERVE_PORT=8000 \
    EDGETPU_SERVE_MODEL_DIR=/models \
    EDGETPU_SERVE_BACKENDS=edgetpu,cpu \
    EDGETPU_SERVE_EDGETPU_ON_FAILURE=fallback \
    EDGETPU_SERVE_FACE_DB=/var/lib/edgetpu-serve/faces.db
# API keys (docs/security.md): this image listens on 0.0.0.0, so admin endpoints
# (reload) answer 403 until an admin key is set; inference is open until inference keys are set.
# Pass keys as secrets, one per line, never baked into the image:
#   docker run ... -v "$PWD/admin_keys:/run/secrets/admin_keys:ro" \
#       -e EDGETPU_SERVE_ADMIN_KEYS_FILE=/run/secrets/admin_keys \
#       -e EDGETPU_SERVE_API_KEYS_FILE=/run/secrets/api_keys ...
# (or EDGETPU_SERVE_API_KEYS / EDGETPU_SERVE_ADMIN_KEYS, comma-separated). Clients send
# "Authorization: Bearer <key>" or "X-API-Key: <key>".
# The face gallery (EDGETPU_SERVE_FACE_DB, docs/faces.md): an SQLite file and its WAL, in a directory of the
# service's user (0700: it holds faces). A volume, so that a new image or container keeps the faces: name it
# (-v edgetpu-serve-faces:/var/lib/edgetpu-serve; a named volume starts as a copy of this directory, owner and
# mode included); a host directory mounted here must be writable by uid 10001.
VOLUME ["/var/lib/edgetpu-serve"]
# uid 10001 = edgetpu: Docker adds its supplementary groups (plugdev) from /etc/group.
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ['EDGETPU_SERVE_PORT'], timeout=4)"]
# Threads start on a Docker engine older than 20.10.10 too (docker/clone3_enosys.py).
ENTRYPOINT ["python", "/usr/local/lib/edgetpu-serve/clone3_enosys.py"]
CMD ["python", "-m", "app"]
