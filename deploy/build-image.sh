#!/bin/sh
# Builds the `steppe` image without pulling anything (there is no registry
# here): a Debian root filesystem made by debootstrap from the apt mirror is
# imported as `steppe-base:SUITE` (once), then the release binary, built on
# this host, goes on top. The host and the image must share a Debian suite
# (the binary links the host's glibc): SUITE defaults to the host's own.
#
# The mirror is the one this host's apt uses for SUITE (from
# /etc/apt/sources.list and sources.list.d, either format), so the image
# builds wherever the host's apt works; MIRROR overrides it.
#
# Environment: SUITE, MIRROR; IMAGE (default steppe:latest); STEPPE_BINARY, a
# steppe binary to put in the image instead of building the release one
# (the tests use their own debug build).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
suite=${SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
# The first URI the host's apt sources give for $suite itself (not -updates
# or -security): one-line `deb URI SUITE …` entries and deb822 stanzas.
host_mirror() {
  apt=${APT_ETC:-/etc/apt}
  for f in "$apt/sources.list" "$apt"/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v s="$1" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } if ($(i + 1) == s) { print $i; exit } }' "$f"
  done
  for f in "$apt"/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v s="$1" '
      function found() { if (uri != "" && hit && deb) { print uri; done = 1; exit } }
      /^[[:space:]]*$/ { found(); uri = ""; hit = 0; deb = 0; next }
      /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) hit = 1 }
      END { if (!done) found() }' "$f"
  done
}
mirror=${MIRROR:-$(host_mirror "$suite" | head -n 1)}
if [ -z "$mirror" ]; then
  echo "deploy: no apt source of this host serves $suite; set MIRROR=URL (a Debian mirror)" >&2
  exit 2
fi
tmp="" context=""
trap 'rm -rf ${tmp:+"$tmp"} ${context:+"$context"}' EXIT

# One debootstrap at a time on this host (tests build images concurrently):
# whoever waited finds the base made.
exec 9>"${TMPDIR:-/tmp}/steppe-base-$suite.lock"
command -v flock >/dev/null && flock 9
if ! docker image inspect "steppe-base:$suite" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  tmp=$(mktemp -d)
  echo "deploy: debootstrap $suite (minbase + redis-server) from $mirror; a few minutes, once" >&2
  debootstrap --variant=minbase --include=redis-server,ca-certificates "$suite" "$tmp/root" "$mirror" >&2
  tar -C "$tmp/root" -c . | docker import - "steppe-base:$suite"
fi
exec 9>&-

image=${IMAGE:-steppe:latest}
binary=${STEPPE_BINARY:-}
if [ -z "$binary" ]; then
  (cd "$root" && cargo build --release -q -p steppe-coordinator)
  binary=${CARGO_TARGET_DIR:-$root/target}/release/steppe
fi
context=$(mktemp -d)
cp "$binary" "$context/steppe"
docker build -q -t "$image" --build-arg "BASE=steppe-base:$suite" -f "$here/Dockerfile" "$context" >/dev/null
[ -f "$here/token" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$here/token"
echo "deploy: built $image; token in deploy/token" >&2
