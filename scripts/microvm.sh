#!/usr/bin/env bash
# Bring up the microvm tier on this machine, idempotently: install QEMU, a C compiler and static libc
# (the guest agent) and e2fsprogs (the root filesystem image), then build the guest kernel, initramfs and
# root filesystem (`hybrid image microvm`: the Debian kernel through apt, the root filesystem from
# the base image scripts/engine.sh builds; cached by their inputs, so a second run is instant).
# Needs root and the base image. Safe to run again at any time.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || missing+=(qemu-system-x86)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
dpkg -s libc6-dev >/dev/null 2>&1 || missing+=(libc6-dev)
command -v mkfs.ext4 >/dev/null 2>&1 || missing+=(e2fsprogs)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "microvm.sh: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
python3 -m hybrid image microvm
