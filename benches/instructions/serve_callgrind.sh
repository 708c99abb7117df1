# Sourced by server.sh and misses.sh: serve_callgrind EXE SCENARIO OUT
# REQUESTS [callgrind options...] runs the load harness's server for
# SCENARIO under callgrind (dumps at OUT.*), drives it over one keep-alive
# connection (3,000 requests to warm up, then REQUESTS counted) and stops it.
serve_callgrind() {
  local exe=$1 scenario=$2 out=$3 requests=$4
  shift 4
  local here port users="" pid
  here=$(dirname "${BASH_SOURCE[0]}")
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  case $scenario in *header*) users=--users ;; esac
  valgrind --tool=callgrind --dump-instr=yes "$@" --callgrind-out-file="$out" \
    "$exe" --serve "$scenario" "$port" redis://127.0.0.1:1 >"$out-server.log" 2>&1 &
  pid=$!
  python3 "$here/http_drive.py" "$port" 3000 $users
  callgrind_control -z "$pid" >/dev/null 2>&1
  python3 "$here/http_drive.py" "$port" "$requests" $users
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
}
