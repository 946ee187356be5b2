/**
 * A sandbox command must not inherit the worker's open file descriptors (a Temporal connection,
 * the billing database, a file a supervisor handed the worker): Node and libuv open theirs
 * close-on-exec, but a descriptor the worker itself inherited without that flag passes through
 * `spawn`, bubblewrap and into the sandbox. `closeInheritedFds` puts a step in front of a command
 * that closes every descriptor but `keep` (stdio and the pipes Slipway passes on purpose:
 * seccomp, egress, a terminal's control pipe) and then execs it, same pid. Given the command's
 * cgroups (limits.ts), it joins them first, so limits need no shell of their own.
 *
 * bash, because dash cannot name descriptors above 9. This step runs on the host, outside the
 * sandbox: it gets Slipway's minimal environment, never the command's (exec.ts HOST_HELPER_ENV,
 * ADR 0027). Still, `-p` (privileged mode) makes bash read no BASH_ENV or ENV, import no functions
 * and ignore SHELLOPTS, BASHOPTS, CDPATH and GLOBIGNORE; `--norc` keeps it from sourcing the
 * host's ~/.bashrc and /etc/bash.bashrc, which Debian's bash does for a non-interactive shell
 * whose stdin is a socket (libuv's pipes are socketpairs) when SHLVL is below 2. The script uses
 * no word splitting and no command lookup (the command is an absolute path).
 */
import path from 'node:path';
import { findExecutable } from './bubblewrap';

// $1: descriptors to keep; $2: how many cgroup.procs files follow, joined first (limits.ts: the
// same step, so a limited command costs no second shell); then the command.
const CLOSE_SCRIPT =
  'k=" $1 "; n=$2; shift 2; ' +
  'while [ "$n" -gt 0 ]; do echo $$ > "$1" || { echo "slipway-limits: cannot join cgroup $1" >&2; exit 125; }; shift; n=$((n-1)); done; ' +
  'for f in /proc/self/fd/*; do n=${f##*/}; case "$k" in *" $n "*) ;; *) eval "exec $n>&-" ;; esac; done; exec "$@"';

let bashPath: string | undefined;

/** `join`: cgroup.procs files (limits.ts `LimitedCommand.join`) the step joins before it execs the command. */
export function closeInheritedFds(keep: number[], command: string, args: string[], join: string[] = []): { command: string; args: string[] } {
  if (!keep.every((fd) => Number.isInteger(fd) && fd >= 0)) throw new Error(`closeInheritedFds: descriptors to keep must be integers, got ${JSON.stringify(keep)}`);
  if (!path.isAbsolute(command)) throw new Error(`closeInheritedFds: the command must be an absolute path, got ${JSON.stringify(command)}`);
  // Looked up once on the worker's PATH (never the command's: that is the tenant's).
  bashPath ??= findExecutable('bash');
  if (!bashPath) throw new Error('bash is needed to close the worker\'s file descriptors before a sandbox command: install bash');
  return { command: bashPath, args: ['--norc', '--noprofile', '-p', '-c', CLOSE_SCRIPT, 'slipway-close-fds', keep.join(' '), String(join.length), ...join, command, ...args] };
}
