#!/bin/sh
# Build every package, keeping the log and the exit status as artifacts so a
# later step can look at a failure instead of losing it with the step.
cd source
go build ./... > ../logs/build.log 2>&1
echo $? > ../logs/status
exit 0
