#!/usr/bin/env bash
# Bring up the container tiers on this machine, idempotently:
#   install docker.io, runsc (gVisor) and debootstrap when missing,
#   write a daemon config that registers runsc, start dockerd when it is not running,
#   wait for the engine, and build the base workstation image and the service images (postgres,
#   redis) once (reused when present).
# Needs root. Safe to run again at any time.
set -euo pipefail

ENGINE_DIR="${HYBRID_ENGINE_DIR:-/var/lib/hybrid-engine}"
CONFIG="$ENGINE_DIR/daemon.json"
LOG="${HYBRID_ENGINE_LOG:-/var/log/hybrid-dockerd.log}"
IMAGE="${HYBRID_BASE_IMAGE:-hybrid/base:bookworm}"

log() { echo "engine.sh: $*" >&2; }

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v runsc >/dev/null 2>&1 || missing+=(runsc)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v npm >/dev/null 2>&1 || missing+=(npm)  # Node lockfiles are packed on the host
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$ENGINE_DIR"

# The docker tiers' seccomp profile is the engine's own default plus a few denials
# (hybrid/workstation/docker/seccomp.py). Debian ships that default (moby's default.json) only in
# the engine's source package golang-github-docker-docker-dev, whose dependencies are ~260 Go
# source packages: take the one file, for the installed engine's version.
SECCOMP="$ENGINE_DIR/docker-default-seccomp.json"
SECCOMP_IN_DEB=./usr/share/gocode/src/github.com/docker/docker/profiles/seccomp/default.json
ENGINE_VERSION="$(dpkg-query -W -f='${source:Version}' docker.io 2>/dev/null || true)"
if [ -z "$ENGINE_VERSION" ]; then
    [ -f "$SECCOMP" ] || log "warning: dockerd is not Debian's docker.io: set HYBRID_DOCKER_SECCOMP to its default seccomp profile (moby's default.json)"
elif [ "$(cat "$SECCOMP.version" 2>/dev/null || true)" != "$ENGINE_VERSION" ] || [ ! -f "$SECCOMP" ]; then
    log "extracting the engine's default seccomp profile (golang-github-docker-docker-dev $ENGINE_VERSION)"
    debs="$(mktemp -d)"
    chmod 0755 "$debs"  # apt-get download drops to the _apt user
    fetch_dev() { (cd "$debs" && apt-get download -qq "golang-github-docker-docker-dev=$ENGINE_VERSION" >/dev/null 2>&1); }
    fetch_dev || { apt-get update -qq && fetch_dev; }
    dpkg-deb --fsys-tarfile "$debs"/golang-github-docker-docker-dev_*.deb | tar -xO "$SECCOMP_IN_DEB" > "$SECCOMP.new"
    python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); assert p["defaultAction"] == "SCMP_ACT_ERRNO"' "$SECCOMP.new"
    mv "$SECCOMP.new" "$SECCOMP"
    echo "$ENGINE_VERSION" > "$SECCOMP.version"
    rm -rf "$debs"
fi

RUNSC="$(command -v runsc)"
# runsc must run with --network=none: this host cannot give it a network namespace of its own
# ("cannot run with network enabled in root network namespace"); ptrace is the platform that works.
cat > "$CONFIG.new" <<JSON
{
  "exec-opts": ["native.cgroupdriver=cgroupfs"],
  "runtimes": {
    "runsc": {"path": "$RUNSC", "runtimeArgs": ["--network=none", "--platform=ptrace"]}
  }
}
JSON
mv "$CONFIG.new" "$CONFIG"

engine_up() { timeout 10 docker info >/dev/null 2>&1; }
# A dockerd that was killed can linger as a zombie until its parent reaps it: not alive.
dockerd_alive() {
    local pid
    for pid in $(pgrep -x dockerd); do
        case "$(ps -o stat= -p "$pid" 2>/dev/null)" in Z*|"") ;; *) return 0 ;; esac
    done
    return 1
}

if ! engine_up; then
    if [ -S /var/run/docker.sock ] && ! dockerd_alive; then
        rm -f /var/run/docker.sock /var/run/docker.pid  # left by a dockerd that died
    fi
    if ! dockerd_alive; then
        log "starting dockerd (log: $LOG)"
        setsid nohup dockerd --config-file "$CONFIG" >>"$LOG" 2>&1 < /dev/null &
    fi
    for _ in $(seq 1 120); do
        engine_up && break
        sleep 0.5
    done
    if ! engine_up; then
        log "dockerd did not come up; last lines of $LOG:"
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
fi

has_runsc() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if ! has_runsc; then
    # A dockerd this script did not start (a distribution service) lacks runsc. Runtimes are
    # reloadable: add runsc to the default config file and send SIGHUP.
    SYSTEM_CONFIG=/etc/docker/daemon.json
    log "registering runsc in $SYSTEM_CONFIG and reloading dockerd"
    mkdir -p /etc/docker
    python3 - "$SYSTEM_CONFIG" "$RUNSC" <<'PY'
import json, pathlib, sys
path, runsc = pathlib.Path(sys.argv[1]), sys.argv[2]
config = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
config.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": ["--network=none", "--platform=ptrace"]}
path.write_text(json.dumps(config, indent=2) + "\n")
PY
    for pid in $(pgrep -x dockerd); do kill -HUP "$pid" || true; done
    for _ in $(seq 1 20); do
        has_runsc && break
        sleep 0.5
    done
    has_runsc || log "warning: dockerd still has no runsc runtime; restart it with --config-file $CONFIG"
fi

# An image built before jobs had their own ids (a host account's, 1000) is built again: its
# account entry and /workspace belong to the old user.
JOB_USER="$(python3 -c 'from hybrid.workstation.jobuser import USER; print(USER)' 2>/dev/null || true)"
FORCE=()
current() {
    FORCE=()
    docker image inspect "$1" >/dev/null 2>&1 || return 1
    [ -z "$JOB_USER" ] && return 0
    [ "$(docker image inspect --format '{{.Config.User}}' "$1")" = "$JOB_USER" ] && return 0
    log "$1 was built for another job user: building it again"
    FORCE=(--force)
    return 1
}
if ! current "$IMAGE"; then
    log "building the base image $IMAGE (debootstrap, about a minute)"
    if command -v hybrid >/dev/null 2>&1; then
        hybrid image bootstrap "${FORCE[@]}" --tag "$IMAGE"
    else
        python3 -c "from hybrid.cli import main; main()" image bootstrap "${FORCE[@]}" --tag "$IMAGE"
    fi
fi
# Service images for [[services]] (from the base image and Debian packages; reused when present).
for service in postgres:15 redis:7; do
    if ! docker image inspect "hybrid/${service}" >/dev/null 2>&1; then
        log "building the service image hybrid/${service}"
        if command -v hybrid >/dev/null 2>&1; then
            hybrid image bootstrap --service "$service"
        else
            python3 -c "from hybrid.cli import main; main()" image bootstrap --service "$service"
        fi
    fi
done
# The node profile (base + Debian's nodejs and npm): Node projects install their lockfile
# offline inside it (hybrid.deps, tests/workstation/test_deps_node.py, hybrid validate).
NODE_IMAGE="${IMAGE}-node"
if ! current "$NODE_IMAGE"; then
    log "building the node profile image $NODE_IMAGE (debootstrap + apt, a few minutes)"
    if command -v hybrid >/dev/null 2>&1; then
        hybrid image bootstrap "${FORCE[@]}" --profile node --tag "$NODE_IMAGE"
    else
        python3 -c "from hybrid.cli import main; main()" image bootstrap "${FORCE[@]}" --profile node --tag "$NODE_IMAGE"
    fi
fi
log "engine ready ($(docker version --format '{{.Server.Version}}'), images $IMAGE, $NODE_IMAGE)"
