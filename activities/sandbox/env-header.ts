/**
 * A command's environment as the first line of its stdin, for commands run in a container or a
 * pod through a client on the host (podman, docker, the Kubernetes exec channel). Never in argv
 * (`/proc/PID/cmdline` is readable by the host's users), and never in the client's own
 * environment: podman and docker run on the host, unconfined, and a tenant's LD_PRELOAD,
 * LD_AUDIT, GCONV_PATH or MALLOC_* there would run code or change behaviour in them (ADR 0027).
 *
 *   setsid -w /bin/sh -c ENV_HEADER_WRAPPER <exec id> <command...>
 *
 * The wrapper reads one line (base64 of `export NAME='value'` lines, plus what the caller puts
 * before them), evaluates it and runs the command, which gets the rest of stdin (sh's `read`
 * takes no byte past the newline from a pipe). The exec id in argv is how a kill finds the group.
 */
import { quote } from 'shell-quote';
import { SessionRequestError } from './session';

export const ENV_HEADER_WRAPPER = ['IFS= read -r h || exit 125', 'eval "$(printf %s "$h" | base64 -d)" || exit 125', '"$@"; s=$?; exit $s'].join('\n');

/** The argv of a command under the wrapper, in its own session and process group. */
export function envHeaderArgv(id: string, inner: string[]): string[] {
  return ['setsid', '-w', '/bin/sh', '-c', ENV_HEADER_WRAPPER, id, ...inner];
}

/** The stdin line that sets `env` (after the `prelude` shell lines, e.g. a cwd check). */
export function envHeader(env: Record<string, string>, prelude: string[] = []): Buffer {
  const lines = [...prelude];
  for (const [k, v] of Object.entries(env)) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) throw new SessionRequestError(`env: ${JSON.stringify(k)} is not a variable name`);
    lines.push(`export ${k}=${quote([v])}`);
  }
  return Buffer.from(`${Buffer.from(lines.join('\n')).toString('base64')}\n`);
}
