#!/usr/bin/env bash
# Runs one test executable (args after the label) with a time limit; if it is still running
# after PROBE_AFTER seconds, dumps every thread's stack (gdb, else eu-stack, else the kernel's
# view) into $OUT/LABEL.stacks, then kills it. Used to find where multi-GPU runs hang.
#   bash bench/tools/hang_probe.sh LABEL EXE [test args...]   (env vars pass through)
label=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
after=${PROBE_AFTER:-40}
"$@" > "$OUT/$label.log" 2>&1 &
pid=$!
for _ in $(seq "$after"); do sleep 1; kill -0 $pid 2>/dev/null || break; done
if kill -0 $pid 2>/dev/null; then
  echo "$label: still running after ${after}s; stacks in $label.stacks"
  if command -v gdb >/dev/null; then
    gdb -p $pid -batch -ex "thread apply all bt 30" > "$OUT/$label.stacks" 2>&1
  elif command -v eu-stack >/dev/null; then
    eu-stack -p $pid > "$OUT/$label.stacks" 2>&1
  else
    for t in /proc/$pid/task/*; do echo "== $t $(cat $t/comm) $(cat $t/wchan)"; cat $t/stack 2>/dev/null; done > "$OUT/$label.stacks"
  fi
  kill -9 $pid; wait $pid 2>/dev/null
  echo "$label: killed"
else
  wait $pid; echo "$label: exit $?"
fi
grep -E "^test |test result|panicked" "$OUT/$label.log" | head -8
