# Sourced by scripts that need a running server (tests/api/test_api.sh, tools/http_vs_engine.sh):
#   daemon_start BIN SETTINGS_JSON API_KEY [extra `tokenmill start` arguments...]
# starts `tokenmill start` on a free port with its own state folder and the given settings text,
# sets $daemon_port and $daemon_state, and stops the server (and removes the folder) on exit.
daemon_start() {
  daemon_bin="$1"
  local settings="$2" key="$3"
  shift 3
  daemon_state="$(mktemp -d)"
  daemon_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  printf '%s\n' "$settings" > "$daemon_state/settings.json"
  trap daemon_stop EXIT
  "$daemon_bin" start --state-dir "$daemon_state" --settings "$daemon_state/settings.json" \
    --port "$daemon_port" --api-key "$key" "$@"
}

daemon_stop() {
  "$daemon_bin" stop --state-dir "$daemon_state" --timeout 10 > /dev/null 2>&1 || true
  rm -rf "$daemon_state"
}
