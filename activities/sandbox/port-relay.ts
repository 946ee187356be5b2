/**
 * Reaching a port a process inside a confined local sandbox listens on (preview ports, ADR 0015).
 *
 * A confined command has its own network namespace (ADR 0006), so "127.0.0.1:3000 of the
 * sandbox" exists only inside the namespace of the command that listens there. The relay is a
 * small program of ours, run with `nsenter --net` into that namespace (and nothing else: it is
 * not in the sandbox's mount, PID or user namespace, so sandbox processes can neither see nor
 * signal it), that connects to 127.0.0.1:port there and copies bytes between the socket and
 * its stdio. The connection is made from inside the sandbox's namespace, so no host address
 * (loopback or other) is reachable through it: the namespace has no route to the host.
 *
 * Which namespaces belong to a sandbox: the confined commands running in it, recorded by
 * execInWorktree as they start (trackSandboxProcess). Their first descendant in another
 * network namespace than ours is the bwrap child; the kernel's own /proc/<pid>/net/tcp{,6}
 * tables (not anything the sandbox writes) say whether something listens on the port there.
 */
import { spawn } from 'node:child_process';
import { promises as fs, realpathSync } from 'node:fs';
import { Duplex } from 'node:stream';
import { findExecutable } from './bubblewrap';

const running = new Map<string, Set<number>>();

const keyOf = (root: string) => {
  try {
    return realpathSync(root);
  } catch {
    return root;
  }
};

/** Records a confined command running in the sandbox at `root`; the returned function forgets it. */
export function trackSandboxProcess(root: string, pid: number): () => void {
  const key = keyOf(root);
  let set = running.get(key);
  if (!set) running.set(key, (set = new Set()));
  set.add(pid);
  return () => {
    const s = running.get(key);
    s?.delete(pid);
    if (s && s.size === 0) running.delete(key);
  };
}

export class PortUnreachableError extends Error {
  constructor(readonly port: number, detail: string) {
    super(`nothing in the sandbox listens on port ${port}${detail ? ` (${detail})` : ''}`);
    this.name = 'PortUnreachableError';
  }
}

async function netnsOf(pid: number | 'self'): Promise<string | undefined> {
  return fs.readlink(`/proc/${pid}/ns/net`).catch(() => undefined);
}

async function childrenOf(pid: number): Promise<number[]> {
  const tasks = await fs.readdir(`/proc/${pid}/task`).catch(() => [] as string[]);
  const out: number[] = [];
  for (const t of tasks) {
    const text = await fs.readFile(`/proc/${pid}/task/${t}/children`, 'utf8').catch(() => '');
    for (const c of text.split(/\s+/).filter(Boolean)) out.push(Number(c));
  }
  return out;
}

/** The first process under `pid` (itself included) whose network namespace is not `hostNs`. */
async function namespacedDescendant(pid: number, hostNs: string, depth = 0): Promise<number | undefined> {
  if (depth > 8) return undefined;
  const ns = await netnsOf(pid);
  if (ns === undefined) return undefined;
  if (ns !== hostNs) return pid;
  for (const c of await childrenOf(pid)) {
    const found = await namespacedDescendant(c, hostNs, depth + 1);
    if (found !== undefined) return found;
  }
  return undefined;
}

const TCP_LISTEN = '0A';

/**
 * Whether a socket listens on `port` in the network namespace of `pid`, from the kernel's
 * tables (pure parser below, table-tested).
 */
async function listensOn(pid: number, port: number): Promise<boolean> {
  for (const table of ['tcp', 'tcp6']) {
    const text = await fs.readFile(`/proc/${pid}/net/${table}`, 'utf8').catch(() => '');
    if (listeningPorts(text).has(port)) return true;
  }
  return false;
}

/** Ports in LISTEN state in a /proc/net/tcp or tcp6 table. */
export function listeningPorts(table: string): Set<number> {
  const ports = new Set<number>();
  for (const line of table.split('\n').slice(1)) {
    const cols = line.trim().split(/\s+/);
    if (cols.length < 4 || cols[3] !== TCP_LISTEN) continue;
    const local = cols[1] ?? '';
    const hex = local.slice(local.lastIndexOf(':') + 1);
    if (/^[0-9A-F]{4}$/i.test(hex)) ports.add(parseInt(hex, 16));
  }
  return ports;
}

// Runs in the sandbox's network namespace only: connects to 127.0.0.1:PORT there, says 'K'
// once connected (so the caller can tell "refused" from an empty answer), then copies bytes.
const RELAY_SOURCE = `
const net = require('net');
const s = net.connect({ host: '127.0.0.1', port: Number(process.argv[1]) }, () => {
  process.stdout.write('K');
  process.stdin.pipe(s);
  s.pipe(process.stdout);
});
s.on('error', (e) => { process.stderr.write(String(e.code || e.message)); process.exit(2); });
s.on('close', () => process.exit(0));
process.stdin.on('end', () => s.end());
`;

/**
 * Opens a byte stream to 127.0.0.1:`port` inside the sandbox at `root`. Rejects with
 * PortUnreachableError when no running command of the sandbox listens there.
 */
export async function connectSandboxPort(root: string, port: number): Promise<Duplex> {
  const pids = [...(running.get(keyOf(root)) ?? [])];
  const hostNs = await netnsOf('self');
  if (!hostNs) throw new Error('cannot read this process\'s network namespace (/proc)');
  const seen = new Set<string>();
  for (const pid of pids) {
    const inner = await namespacedDescendant(pid, hostNs);
    if (inner === undefined) continue;
    const ns = await netnsOf(inner);
    if (!ns || seen.has(ns)) continue;
    seen.add(ns);
    if (await listensOn(inner, port)) return relay(inner, port);
  }
  throw new PortUnreachableError(port, pids.length === 0 ? 'no command is running in it' : '');
}

function relay(pid: number, port: number): Promise<Duplex> {
  const nsenter = findExecutable('nsenter');
  if (!nsenter) throw new Error('nsenter (util-linux) is needed to reach ports inside confined sandboxes');
  // Root may enter any namespace; another user enters the sandbox's user namespace (its own) first.
  const ns = process.getuid?.() === 0 ? ['--net'] : ['--user', '--net', '--preserve-credentials'];
  const child = spawn(nsenter, [`--target=${pid}`, ...ns, '--', process.execPath, '-e', RELAY_SOURCE, String(port)], {
    stdio: ['pipe', 'pipe', 'pipe'],
    env: { PATH: '/usr/bin:/bin' },
  });
  return new Promise((resolve, reject) => {
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString('utf8')).slice(-500)));
    const onExit = (code: number | null) => reject(new PortUnreachableError(port, stderr.trim() || `relay exited with ${code}`));
    child.once('exit', onExit);
    child.once('error', reject);
    child.stdout.once('readable', function first() {
      const head = child.stdout.read(1) as Buffer | null;
      if (head === null) return void child.stdout.once('readable', first);
      child.off('exit', onExit);
      if (head.toString() !== 'K') {
        child.kill('SIGKILL');
        return reject(new PortUnreachableError(port, 'relay failed'));
      }
      const duplex = Duplex.from({ readable: child.stdout, writable: child.stdin });
      duplex.on('close', () => child.kill('SIGKILL'));
      child.stdin.on('error', () => undefined);
      resolve(duplex);
    });
  });
}
