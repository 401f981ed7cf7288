#!/usr/bin/env bash
# Checks the deployment files (systemd/, Dockerfile, deploy/) and boots the built daemon
# the way they run it. One line per check: ok, skip (a tool is missing here) or FAIL with
# the reason; exits 1 if any check failed. tests/run.sh calls it (STRATA_SKIP_DEPLOY=1
# skips it there).
#   systemd unit            `systemd-analyze verify` on systemd/strata.service, its
#                           ExecStart pointed at the built binary; any warning about the
#                           unit fails (verify itself exits 0 on unknown keys)
#   systemd sysusers        `systemd-sysusers --dry-run` on systemd/strata.sysusers
#   unit / Dockerfile / compose / k8s / README
#                           tests/deploy_files.py (see there): settings the others rely
#                           on, and that the files agree with each other
#   docker compose config   `docker compose config -q` where the compose plugin exists
#   kubernetes schemas      kubernetes-validate --strict, Kubernetes 1.29 and 1.37
#   nginx -t                deploy/nginx.conf inside a minimal nginx.conf, as any user
#   serve: ...              strata serve --config (a copy of config/strata.toml) as
#                           systemd starts it: STRATA_PORT/STRATA_HOME from the
#                           environment, a notify socket, stderr as the journal; then
#                           SIGHUP after adding an API key to the file, then SIGTERM
# Needs python3 >= 3.11 with venv, curl, and PyPI on first use (target/deploy-venv).
# STRATA_BIN (default target/release/strata; built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
source tests/clients/venv.sh

bin=${STRATA_BIN:-$root/target/release/strata}
[[ -x $bin ]] || cargo build --release --locked
venv=$root/target/deploy-venv
tmp=$(mktemp -d -t strata-deploy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failed=()
checks=0
exec 3>&1

# run NAME FUNCTION: runs FUNCTION in a subshell with errexit (any failing command fails
# the check), its output kept in a log that is shown if it fails. Exit status 77 is a
# skip, with the log's last line as the reason.
run() {
  local name=$1 log rc
  log=$tmp/check-$((++checks)).log
  set +e
  (set -e; "$2") >"$log" 2>&1
  rc=$?
  set -e
  case $rc in
    0) printf 'ok    %s\n' "$name" ;;
    77) printf 'skip  %s: %s\n' "$name" "$(tail -n 1 "$log")" ;;
    *)
      printf 'FAIL  %s\n' "$name"
      sed 's/^/      /' "$log"
      failed+=("$name")
      ;;
  esac
}

skip() { echo "$*"; exit 77; }
die() { echo "$*" >&2; exit 1; }
# A line of its own for one step of a check that has several.
step() { printf 'ok    %s\n' "$*" >&3; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
need_venv() { ensure_venv "$venv" tests/deploy-requirements.txt >/dev/null; }

check_unit_verify() {
  command -v systemd-analyze >/dev/null || skip "systemd-analyze is not installed"
  local dir=$tmp/unit out
  mkdir -p "$dir"
  # verify fails when ExecStart's binary does not exist; the unit names the installed path.
  sed "s|^ExecStart=/usr/local/bin/strata |ExecStart=$bin |" systemd/strata.service >"$dir/strata.service"
  grep -q "^ExecStart=$bin serve" "$dir/strata.service" || die "systemd/strata.service has no ExecStart=/usr/local/bin/strata serve"
  out=$(systemd-analyze verify "$dir/strata.service" 2>&1) || die "systemd-analyze verify failed: $out"
  # Unknown keys and bad values are only warnings; other units' warnings are not ours.
  if grep -F "strata.service" <<<"$out"; then
    die "systemd-analyze verify warns about the unit (above)"
  fi
}

check_sysusers() {
  command -v systemd-sysusers >/dev/null || skip "systemd-sysusers is not installed"
  mkdir -p "$tmp/sysroot/etc"
  systemd-sysusers --dry-run --root="$tmp/sysroot" "$root/systemd/strata.sysusers"
}

check_files() { need_venv; "$venv/bin/python" tests/deploy_files.py "$1"; }
check_unit_files() { check_files unit; }
check_dockerfile() { check_files dockerfile; }
check_compose() { check_files compose; }
check_k8s_files() { check_files k8s; }
check_readme() { check_files readme; }

check_compose_config() {
  command -v docker >/dev/null || skip "docker is not installed"
  docker compose version >/dev/null 2>&1 || skip "the docker compose plugin is not installed"
  docker compose -f deploy/compose.yaml config -q
}

check_k8s_schemas() {
  need_venv
  local version
  for version in 1.29.0 1.37.0; do
    "$venv/bin/kubernetes-validate" --strict --quiet -k "$version" deploy/k8s/*.yaml ||
      die "kubernetes-validate rejects deploy/k8s/ for Kubernetes $version"
  done
}

check_nginx() {
  local nginx
  nginx=$(PATH=$PATH:/usr/sbin:/sbin command -v nginx) || skip "nginx is not installed"
  local dir=$tmp/nginx port
  mkdir -p "$dir"
  port=$(free_port)
  # nginx -t binds the listen addresses: a free high port instead of 80 lets it run as
  # any user next to a running nginx.
  sed -E "s/^([[:space:]]*listen)[[:space:]]+[^;]+;/\1 127.0.0.1:$port;/" deploy/nginx.conf >"$dir/strata.conf"
  grep -q "listen 127.0.0.1:$port;" "$dir/strata.conf" || die "deploy/nginx.conf has no listen directive"
  cat >"$dir/nginx.conf" <<EOF
pid $dir/nginx.pid;
error_log stderr;
events {}
http {
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    access_log off;
    include $dir/strata.conf;
}
EOF
  "$nginx" -t -q -e stderr -p "$dir" -c "$dir/nginx.conf"
}

# strata serve as systemd/strata.service runs it. Each step prints its own line.
check_serve() {
  [[ -f config/strata.toml ]] || die "config/strata.toml (the documented default config) is missing"
  local home=$tmp/home sock=$tmp/notify.sock notes=$tmp/notify.log log=$tmp/serve.log
  # config/strata.toml as it is; a copy, so that the SIGHUP step can add an API key.
  local config=$tmp/strata.toml key=sk-deploy-test
  install -m 0600 config/strata.toml "$config"
  local port url rc start pid="" listener=""
  mkdir -p "$home"
  port=$(free_port)
  url=http://127.0.0.1:$port
  # shellcheck disable=SC2317  # run by the EXIT trap
  stop() {
    [[ -z $pid ]] || kill -KILL "$pid" 2>/dev/null || true
    [[ -z $listener ]] || kill "$listener" 2>/dev/null || true
    echo "--- strata serve's output:"
    cat "$log"
  }
  trap stop EXIT
  # Whether the server has exited (a zombie until it is waited for).
  exited() {
    local state
    state=$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) || return 0
    [[ $state == Z ]]
  }

  # The notify socket systemd gives a Type=notify service: every datagram, one line each.
  : >"$notes"
  python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a") as out:
    while True:
        out.write(s.recv(4096).decode(errors="replace").strip() + "\n")
        out.flush()
' "$sock" "$notes" &
  listener=$!
  for _ in $(seq 50); do [[ -S $sock ]] && break; sleep 0.1; done
  [[ -S $sock ]] || die "the notify socket listener did not start"

  # stderr is "the journal" when JOURNAL_STREAM names its device and inode.
  : >"$log"
  local journal
  journal=$(stat -c '%d:%i' "$log")
  # Only the settings given here: none of the caller's STRATA_* variables.
  local -a unset_env=()
  local v
  for v in $(compgen -e); do [[ $v == STRATA_* ]] && unset_env+=(-u "$v"); done
  env "${unset_env[@]}" STRATA_HOME="$home" STRATA_PORT="$port" NOTIFY_SOCKET="$sock" \
    JOURNAL_STREAM="$journal" \
    "$bin" serve --config "$config" >"$log" 2>&1 &
  pid=$!

  for _ in $(seq 600); do
    curl -fsS -o /dev/null "$url/health" 2>/dev/null && break
    if exited; then
      rc=0
      wait "$pid" || rc=$?
      pid=""
      die "strata serve exited at start with status $rc"
    fi
    sleep 0.1
  done
  curl -fsS -o /dev/null "$url/health" || die "no /health 200 on STRATA_PORT=$port within 60 s"
  # The PID file under STRATA_HOME names this process and the address it listens on.
  python3 - "$(ls "$home"/run/serve-*_"$port".pid 2>/dev/null | head -1)" "$pid" "$port" <<'EOF' || die "the PID file in STRATA_HOME/run does not name this server on STRATA_PORT"
import json, sys
f = json.load(open(sys.argv[1]))
print("PID file:", f)
sys.exit(not (f["pid"] == int(sys.argv[2]) and f["addr"].rsplit(":", 1)[1] == sys.argv[3]))
EOF
  step "serve: --config (config/strata.toml), /health 200 on STRATA_PORT, PID file in STRATA_HOME"

  for _ in $(seq 50); do grep -qx 'READY=1' "$notes" && break; sleep 0.1; done
  grep -qx 'READY=1' "$notes" || die "no READY=1 on NOTIFY_SOCKET (got: $(tr '\n' ' ' <"$notes"))"
  step "serve: sd_notify READY=1"

  grep -qE '^<[0-7]>' "$log" || die "stderr is the journal (JOURNAL_STREAM) but no line has a <N> priority prefix"
  if grep -q $'\e\\[' "$log"; then die "colour escapes in the journal"; fi
  if grep -qE '^<[0-7]>[0-9]{4}-[0-9]{2}-[0-9]{2}T' "$log"; then die "timestamps in the journal (it adds its own)"; fi
  step "serve: journal lines carry <N> priority prefixes, no colours or timestamps"

  # SIGHUP applies a new API key at once.
  status() { curl -sS -o /dev/null -w '%{http_code}' "$@"; }
  [[ $(status "$url/v1/models") == 200 ]] || die "GET /v1/models is not 200 without API keys configured"
  if grep -qE '^api-key[[:space:]]*=' "$config"; then
    sed -i -E "s/^api-key[[:space:]]*=.*/api-key = [\"$key\"]/" "$config"
  else
    printf 'api-key = ["%s"]\n' "$key" >>"$config"
  fi
  kill -HUP "$pid"
  local code
  for _ in $(seq 50); do
    code=$(status "$url/v1/models") || true
    [[ $code == 401 ]] && break
    exited && break
    sleep 0.1
  done
  ! exited || die "SIGHUP stopped the server"
  [[ $code == 401 ]] || die "GET /v1/models without a key is $code 5 s after SIGHUP added api-key (want 401)"
  [[ $(status -H "Authorization: Bearer $key" "$url/v1/models") == 200 ]] || die "the API key added before SIGHUP is not accepted"
  curl -fsS -o /dev/null "$url/health" || die "/health is not 200 (without a key) after SIGHUP"
  step "serve: SIGHUP applies an api-key added to the config file; still running and healthy"

  # An idle server has nothing to drain: it should exit at once, not after its grace.
  start=$SECONDS
  kill -TERM "$pid"
  for _ in $(seq 50); do exited && break; sleep 0.1; done
  exited || die "still running 5 s after SIGTERM"
  rc=0
  wait "$pid" || rc=$?
  pid=""
  ((rc == 0)) || die "exit status $rc after SIGTERM (want 0)"
  ! ls "$home"/run/serve-*_"$port".pid >/dev/null 2>&1 || die "the PID file is still there after exit"
  sleep 0.2
  grep -qx 'STOPPING=1' "$notes" || die "no STOPPING=1 on NOTIFY_SOCKET (got: $(tr '\n' ' ' <"$notes"))"
  kill "$listener" 2>/dev/null || true
  listener=""
  trap - EXIT
  step "serve: SIGTERM: exit 0 in $((SECONDS - start)) s, STOPPING=1, PID file removed"
}

run "systemd unit (systemd-analyze verify)" check_unit_verify
run "systemd sysusers (systemd-sysusers --dry-run)" check_sysusers
run "systemd unit settings (tests/deploy_files.py unit)" check_unit_files
run "Dockerfile and .dockerignore (tests/deploy_files.py dockerfile)" check_dockerfile
run "deploy/compose.yaml (tests/deploy_files.py compose)" check_compose
run "deploy/compose.yaml (docker compose config)" check_compose_config
run "deploy/k8s schemas (kubernetes-validate)" check_k8s_schemas
run "deploy/k8s agrees with the image (tests/deploy_files.py k8s)" check_k8s_files
run "deploy/nginx.conf (nginx -t)" check_nginx
run "deploy/README.md shows deploy/nginx.conf (tests/deploy_files.py readme)" check_readme
run "serve: strata serve as the systemd unit runs it" check_serve

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "deployment checks passed"
