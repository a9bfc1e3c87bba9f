#!/usr/bin/env bash
# Base images for a machine that reaches Debian's mirror but no container registry.
#
#   image/local-base.sh            # localhost/tandem-base:bookworm and localhost/pause:3.10
#
# tandem-base: a debootstrap minbase of Debian 12 with Python 3.11 and venv (what the
# Dockerfile needs of python:3.11-slim-bookworm). pause: catatonit in pause mode, from
# Debian's package, for the kubelet's pod sandboxes. Built with buildah into its storage;
# `make image` and the e2e fixture take them from there.
set -euo pipefail
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
BASE=${BASE_TAG:-localhost/tandem-base:bookworm}
PAUSE=${PAUSE_TAG:-localhost/pause:3.10}

base() {
  local ctr mnt
  ctr=$(buildah from scratch)
  mnt=$(buildah mount "$ctr")
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$mnt" "$MIRROR" >/dev/null
  rm -rf "$mnt"/var/cache/apt/archives/*.deb "$mnt"/var/lib/apt/lists/*
  buildah umount "$ctr" >/dev/null
  buildah config --env LANG=C.UTF-8 --cmd /bin/bash "$ctr"
  buildah commit -q "$ctr" "$BASE"
  buildah rm "$ctr" >/dev/null
}

pause() {
  local ctr
  ctr=$(buildah from scratch)
  buildah copy -q "$ctr" "$(command -v catatonit)" /pause
  buildah config --entrypoint '["/pause", "-P"]' --user 65535:65535 "$ctr"
  buildah commit -q "$ctr" "$PAUSE"
  buildah rm "$ctr" >/dev/null
}

buildah inspect --type image "$BASE" >/dev/null 2>&1 || base
buildah inspect --type image "$PAUSE" >/dev/null 2>&1 || pause
echo "$BASE $PAUSE"
