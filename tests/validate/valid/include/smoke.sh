#!/bin/sh
# Smoke test the built binary: it must start and answer --version.
set -eu
./dist/widgets --version
echo "smoke ok"
