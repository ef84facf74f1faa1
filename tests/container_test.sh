#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/container where podman is installed: both images built, a job run from them (one
# shard pod, two trainers), the loss falling, whole lines, the server image at most 200 MB.
# Exits 77 (skipped), saying so, without podman or root: scripts/setup installs neither podman
# nor its base, and a first build (Debian's torch, a full compile) takes longer than CI's
# budget; later builds reuse the base, the layers and the build's cache mounts.
# Usage: container_test.sh SOURCE_DIR
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: scripts/container did not run: it needs root (podman as root)"
  exit 77
fi
if ! command -v podman >/dev/null; then
  echo "skipped: scripts/container did not run: podman is not installed" \
    "(apt-get install podman runc catatonit debootstrap)"
  exit 77
fi
exec "$1/scripts/container"
