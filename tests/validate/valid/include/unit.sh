#!/bin/sh
# Unit tests for the widgets service. Runs inside the task's own directory,
# which holds only the declared inputs (here: source/).
set -eu
cd source
go vet ./...
go test -count=1 -race ./...
echo "unit tests pass"
