#!/bin/sh
# Builds the `steppe` image without pulling anything (there is no registry
# here): a Debian root filesystem made by debootstrap from the apt mirror is
# imported as `steppe-base:SUITE` (once), then the release binary, built on
# this host, goes on top. The host and the image must share a Debian suite
# (the binary links the host's glibc): SUITE defaults to the host's own.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
suite=${SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
mirror=${MIRROR:-http://deb.debian.org/debian}

if ! docker image inspect "steppe-base:$suite" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "deploy: debootstrap $suite (minbase + redis-server) from $mirror; a few minutes, once" >&2
  debootstrap --variant=minbase --include=redis-server,ca-certificates "$suite" "$tmp/root" "$mirror" >&2
  tar -C "$tmp/root" -c . | docker import - "steppe-base:$suite"
fi

(cd "$root" && cargo build --release -q -p steppe-coordinator)
target=${CARGO_TARGET_DIR:-$root/target}
mkdir -p "$here/context"
cp "$target/release/steppe" "$here/context/steppe"
docker build -q -t steppe:latest --build-arg "BASE=steppe-base:$suite" -f "$here/Dockerfile" "$here/context"
[ -f "$here/token" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$here/token"
echo "deploy: built steppe:latest; token in deploy/token" >&2
