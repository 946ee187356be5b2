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
 * DNS: a host whose resolver listens on its own loopback (systemd-resolved's 127.0.0.53, a local
 * dnsmasq) would leave the sandbox without names, since its loopback is out of reach. Then
 * pasta maps one fixed address, SANDBOX_DNS, to that resolver for DNS only
 * (`--dns-forward SANDBOX_DNS --dns-host <resolver>`), and the sandbox's /etc/resolv.conf names
 * SANDBOX_DNS. Every other port of the resolver's address, and all of the host's loopback, stay
 * unreachable. pasta before `--dns-host` (Debian 12's 2023-03 build) forwards only to a
 * non-loopback resolver and drops loopback ones under `--no-map-gw`; there Slipway warns once
 * and the sandbox has no DNS rather than the host's loopback. A resolver on another address is
 * reached like any host and needs nothing.
 *
 * The dance: bwrap reports the sandbox's pid on an info fd and waits on a block fd; pasta attaches
 * to `/proc/<pid>/ns/net`; once the namespace has its default route, the block fd is released and
 * the command starts. pasta runs in the foreground under `setpriv --pdeathsig KILL`, so it dies
 * with the worker even when the worker is killed with SIGKILL, and is killed when the command ends.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, promises as fs, readFileSync, writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import os from 'node:os';
import path from 'node:path';
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

/** The address a sandbox asks for names when the host's resolver is on its loopback (link-local, never routed). */
export const SANDBOX_DNS = '169.254.83.53';

/**
 * The host's resolver when it listens on loopback (so pasta must forward to it), else undefined.
 * Read from /etc/resolv.conf, or from `$SLIPWAY_HOST_RESOLV_CONF` where the host keeps it elsewhere.
 */
export function loopbackResolver(file = process.env.SLIPWAY_HOST_RESOLV_CONF || '/etc/resolv.conf'): string | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  // pasta forwards to the first IPv4 resolver, as glibc asks the first one first.
  for (const line of text.split('\n')) {
    const m = line.match(/^\s*nameserver\s+([^\s%#]+)/);
    if (!m || isIP(m[1]) !== 4) continue;
    return m[1].startsWith('127.') ? m[1] : undefined;
  }
  return undefined;
}

let resolvFile: string | undefined;
/** A resolv.conf naming SANDBOX_DNS, written once per process where no sandbox can write, bound read-only at /etc/resolv.conf. */
export function sandboxResolvConf(): string {
  // Made again when a /tmp cleaner took it.
  if (resolvFile && existsSync(resolvFile)) return resolvFile;
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-dns-'));
  const file = path.join(dir, 'resolv.conf');
  writeFileSync(file, `# Slipway: the host's loopback resolver, forwarded by pasta for DNS only\nnameserver ${SANDBOX_DNS}\n`, { mode: 0o644 });
  resolvFile = file;
  return file;
}

let dnsHost: boolean | undefined;
/** True when this pasta can forward DNS to a resolver of our choosing (`--dns-host`, passt 2024 and later). */
export function pastaHasDnsHost(pasta: string): boolean {
  if (dnsHost === undefined) {
    const help = spawnSync(pasta, ['--help'], { encoding: 'utf8', timeout: 10_000 });
    dnsHost = `${help.stdout ?? ''}${help.stderr ?? ''}`.includes('--dns-host');
  }
  return dnsHost;
}

export const PASTA_DNS_HOST_MISSING = (resolver: string) =>
  `the host's resolver ${resolver} listens on loopback and this pasta cannot forward DNS to it (it lacks --dns-host); sandboxes with the network on have no DNS. Install a newer passt (2024 or later) or give the host a resolver on a non-loopback address`;

export function pastaArgs(sandboxPid: number, dns?: { resolver: string }): string[] {
  return [
    '-f', '-q', '--config-net',
    '-t', 'none', '-u', 'none', '-T', 'none', '-U', 'none',
    '--no-map-gw',
    ...(dns ? ['--dns-forward', SANDBOX_DNS, '--dns-host', dns.resolver] : []),
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
export function egressSetup(tools: { pasta: string; setpriv: string }, dns?: { resolver: string }): { prepare: (child: ChildProcess) => Promise<void>; stop: () => Promise<void> } {
  let pasta: ChildProcess | undefined;
  let stopped = false;
  return {
    async prepare(child) {
      const info = child.stdio[INFO_FD] as Readable;
      const block = child.stdio[BLOCK_FD] as Writable;
      const pid = await readChildPid(info);
      if (stopped) return;
      pasta = spawn(tools.setpriv, ['--pdeathsig', 'KILL', '--', tools.pasta, ...pastaArgs(pid, dns)], { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
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
