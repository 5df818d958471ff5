# edgetpu-serve for x86-64 hosts with a Coral USB Accelerator (an M.2/PCIe TPU works too).
#
#   docker build -t edgetpu-serve .
#   docker run --rm -p 8000:8000 --device /dev/bus/usb -v "$PWD/models:/models:ro" edgetpu-serve
#
# Versions: app/edgetpu/versions.toml is the one place they are pinned; the ARG defaults
# below must equal its [image] and [image.amd64] (tests/test_docker.py checks). The service
# image holds the service's dependencies only: no TensorFlow, no compiler, no build tools.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ARG TFLITE_RUNTIME_VERSION=2.17.1
ARG TFLITE_RUNTIME_WHEEL=https://github.com/frigate-nvr/TFlite-builds/releases/download/v2.17.1/tflite_runtime-2.17.1-cp311-cp311-linux_x86_64.whl
ARG LIBEDGETPU_RELEASE=16.0TF2.17.1-1
ARG LIBEDGETPU_DEB_VERSION=16.0tf2.17.1-1
ARG LIBEDGETPU_FLAVOR=std
ARG DEB_ARCH=amd64
COPY docker/requirements.txt /build/requirements.txt
# The venv is copied whole into the final stage (same base image, same Python path).
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r /build/requirements.txt "${TFLITE_RUNTIME_WHEEL}" \
    && /opt/venv/bin/python -c "import importlib.metadata as m, sys; v = m.version('tflite-runtime'); sys.exit(0 if v == '${TFLITE_RUNTIME_VERSION}' else 'tflite-runtime ' + v + ' != ${TFLITE_RUNTIME_VERSION}')"
# libedgetpu built from the same TF release as that tflite_runtime (community build).
ADD https://github.com/feranick/libedgetpu/releases/download/${LIBEDGETPU_RELEASE}/libedgetpu1-${LIBEDGETPU_FLAVOR}_${LIBEDGETPU_DEB_VERSION}.bookworm_${DEB_ARCH}.deb /build/libedgetpu.deb

FROM ${BASE_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG LIBEDGETPU_FLAVOR=std
# plugdev (gid 46 on Debian and Ubuntu hosts) owns the USB Accelerator's nodes under the
# udev rules in the README; another host gid: docker run --group-add <gid>.
ARG USB_GROUP=plugdev
COPY --from=build /build/libedgetpu.deb /tmp/libedgetpu.deb
# apt resolves the package's dependency (libusb-1.0-0); the max flavor asks to accept its EULA.
RUN echo "libedgetpu1-${LIBEDGETPU_FLAVOR} libedgetpu/accepted-eula boolean true" | debconf-set-selections \
    && apt-get update \
    && apt-get install -y --no-install-recommends /tmp/libedgetpu.deb \
    && rm -rf /var/lib/apt/lists/* /tmp/libedgetpu.deb \
    && groupadd --system --gid 10001 edgetpu \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --groups "${USB_GROUP}" edgetpu
COPY --from=build /opt/venv /opt/venv
WORKDIR /srv/edgetpu-serve
COPY app ./app
# Baked default models; mount your own (with *_int8_edgetpu.tflite files) over /models.
COPY models /models
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    EDGETPU_SERVE_HOST=0.0.0.0 \
    EDGETPU_SERVE_PORT=8000 \
    EDGETPU_SERVE_MODEL_DIR=/models \
    EDGETPU_SERVE_BACKENDS=edgetpu,cpu \
    EDGETPU_SERVE_EDGETPU_ON_FAILURE=fail
# API keys (README "Security and limits"): this image listens on 0.0.0.0, so admin endpoints
# (reload) answer 403 until an admin key is set; inference is open until inference keys are set.
# Pass keys as secrets, one per line, never baked into the image:
#   docker run ... -v "$PWD/admin_keys:/run/secrets/admin_keys:ro" \
#       -e EDGETPU_SERVE_ADMIN_KEYS_FILE=/run/secrets/admin_keys \
#       -e EDGETPU_SERVE_API_KEYS_FILE=/run/secrets/api_keys ...
# (or EDGETPU_SERVE_API_KEYS / EDGETPU_SERVE_ADMIN_KEYS, comma-separated). Clients send
# "Authorization: Bearer <key>" or "X-API-Key: <key>".
# uid 10001 = edgetpu: Docker adds its supplementary groups (plugdev) from /etc/group.
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/readyz' % os.environ['EDGETPU_SERVE_PORT'], timeout=4)"]
CMD ["python", "-m", "app"]
