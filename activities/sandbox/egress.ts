/**
 * Egress-only networking for confined sandboxes whose network is on (ADR 0006).
 *
 * A confined command always gets its own network namespace (`bwrap --unshare-net`). With the
 * network on, pasta (Debian package `passt`) gives that namespace a tap interface whose traffic
 * pasta carries out through ordinary sockets of the host: connections to the internet work, but
 * the host's loopback is not the sandbox's loopback, no port is forwarded either way
 * (`-t none -u none -T none -U none`), and the gateway address is not mapped to the host
 * (`--no-map-gw`). So the Temporal server, the API, Postgres and anything else listening on the
 * host's 127.0.0.1 are out of reach, even though the sandbox can fetch packages and call model APIs.
 *
 * The dance: bwrap reports the sandbox's pid on an info fd and waits on a block fd; pasta attaches
 * to `/proc/<pid>/ns/net`; once the namespace has its default route, the block fd is released and
 * the command starts. pasta runs in the foreground under `setpriv --pdeathsig KILL`, so it dies
 * with the worker even when the worker is killed with SIGKILL, and is killed when the command ends.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { promises as fs } from 'node:fs';
import type { Readable, Writable } from 'node:stream';
import { findExecutable } from './bubblewrap';
import { killProcessGroup } from '../process';

export const PASTA_MISSING_MESSAGE =
  'pasta (Debian package passt) is not installed; sandboxes with the network on then share the host network, loopback included. Install it with `apt-get install passt`';

export const INFO_FD = 3;
export const BLOCK_FD = 4;

/** pasta and setpriv, or undefined when either is missing. */
export function findEgressTools(): { pasta: string; setpriv: string } | undefined {
  const pasta = findExecutable('pasta');
  const setpriv = findExecutable('setpriv');
  return pasta && setpriv ? { pasta, setpriv } : undefined;
}

export function pastaArgs(sandboxPid: number): string[] {
  return [
    '-f', '-q', '--config-net',
    '-t', 'none', '-u', 'none', '-T', 'none', '-U', 'none',
    '--no-map-gw',
    // As root pasta would drop to nobody before opening the namespace, which it then may not.
    ...(process.getuid?.() === 0 ? ['--runas', '0:0'] : []),
    '--netns', `/proc/${sandboxPid}/ns/net`,
  ];
}

/** Reads bwrap's `{"child-pid": N}` from the info fd. */
function readChildPid(info: Readable): Promise<number> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const onData = (d: Buffer) => {
      buf += d.toString();
      const m = buf.match(/"child-pid":\s*(\d+)/);
      if (m) {
        info.off('data', onData);
        resolve(Number(m[1]));
      }
    };
    info.on('data', onData);
    info.once('close', () => reject(new Error('the sandbox ended before its network was set up')));
  });
}

/** True once the namespace of `pid` has a default route (pasta's --config-net is done). */
async function hasDefaultRoute(pid: number): Promise<boolean> {
  const routes = await fs.readFile(`/proc/${pid}/net/route`, 'utf8').catch(() => '');
  return routes.split('\n').slice(1).some((line) => line.split('\t')[1] === '00000000');
}

/**
 * `prepare` for runProcess: attaches pasta to the sandbox's namespace, then lets the command
 * start. Returns the cleanup through `stop` (called when the command exits).
 */
export function egressSetup(tools: { pasta: string; setpriv: string }): { prepare: (child: ChildProcess) => Promise<void>; stop: () => Promise<void> } {
  let pasta: ChildProcess | undefined;
  let stopped = false;
  return {
    async prepare(child) {
      const info = child.stdio[INFO_FD] as Readable;
      const block = child.stdio[BLOCK_FD] as Writable;
      const pid = await readChildPid(info);
      if (stopped) return;
      pasta = spawn(tools.setpriv, ['--pdeathsig', 'KILL', '--', tools.pasta, ...pastaArgs(pid)], { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
      let stderr = '';
      pasta.stderr?.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
      const exited = new Promise<never>((_, reject) =>
        pasta!.once('exit', (code) => reject(new Error(`pasta could not set up the sandbox's network (exit ${code}): ${stderr.replace(/Failed to send \d+ bytes to syslog\n?/g, '').trim()}`))),
      );
      exited.catch(() => undefined);
      // Wait on the condition (the route appears within milliseconds), bounded so a broken
      // pasta fails the command rather than hanging it.
      const deadline = Date.now() + 15_000;
      while (!(await hasDefaultRoute(pid))) {
        if (Date.now() > deadline) throw new Error(`pasta did not configure the sandbox's network: ${stderr.trim()}`);
        await Promise.race([new Promise((r) => setTimeout(r, 5)), exited]);
      }
      block.write('1');
    },
    async stop() {
      stopped = true;
      if (pasta?.pid && pasta.exitCode === null) killProcessGroup(pasta.pid);
    },
  };
}
