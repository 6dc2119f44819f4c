# Sourced by demo.sh: the processes the demo starts, recognised by pid file.
# A pid file holds the pid and the process's start time (field 22 of /proc/<pid>/stat),
# so the process we started is recognised whatever its command line (capture started with
# --config, say), and a pid the kernel gave to another process since is not.
# Needs: PIDS (the pid directory).

started_at() {  # started_at PID: the kernel's start time of the process, or nothing
  sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | awk '{print $20}'
}

record() {  # record NAME PID
  echo "$2 $(started_at "$2")" > "$PIDS/$1.pid"
}

alive() {  # alive NAME: the pid in our pid file, if that very process still runs
  local pid="" since=""
  [[ -f "$PIDS/$1.pid" ]] || return 1
  read -r pid since < "$PIDS/$1.pid" || true
  [[ -n "$pid" ]] || return 1
  if [[ -z "$since" ]]; then  # a pid file from an older demo.sh: the pid alone
    kill -0 "$pid" 2>/dev/null && echo "$pid"
    return
  fi
  [[ "$(started_at "$pid")" == "$since" ]] && echo "$pid"
}
