/**
 * Reaching a port a process inside a confined local sandbox listens on (preview ports, ADR 0015).
 *
 * A confined command has its own network namespace (ADR 0006), so "127.0.0.1:3000 of the
 * sandbox" exists only inside the namespace of the command that listens there. The relay is a
 * small program of ours, run with `nsenter --net` into that namespace (and nothing else: it is
 * not in the sandbox's mount, PID or user namespace, so sandbox processes can neither see nor
 * signal it), listening on a Unix socket in a private folder of this process; for each
 * connection there it connects to 127.0.0.1:port in the sandbox's namespace and copies bytes.
 * The connection is made from inside that namespace, so no host address (loopback or other) is
 * reachable through it: the namespace has no route to the host.
 *
 * Which namespaces belong to a sandbox: the confined commands running in it, recorded by
 * preparedCommand (exec and sessions) as they start (trackSandboxProcess). Their first descendant in another
 * network namespace than ours is the bwrap child; the kernel's own /proc/<pid>/net/tcp{,6}
 * tables (not anything the sandbox writes) say whether something listens on the port there.
 */
import { spawn } from 'node:child_process';
import { promises as fs, realpathSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { findExecutable } from './bubblewrap';

const running = new Map<string, Set<number>>();

const keyOf = (root: string) => {
  try {
    return realpathSync(root);
  } catch {
    return root;
  }
};

/** Records a confined command running in the sandbox at `root`; the returned function forgets it (and stops its relays). */
export function trackSandboxProcess(root: string, pid: number): () => void {
  const key = keyOf(root);
  let set = running.get(key);
  if (!set) running.set(key, (set = new Set()));
  set.add(pid);
  return () => {
    const s = running.get(key);
    s?.delete(pid);
    if (s && s.size === 0) running.delete(key);
    for (const [k, r] of relays) if (r.owner === pid) stopRelay(k);
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

// Runs in the sandbox's network namespace only (the host's filesystem, none of the sandbox's
// other namespaces): listens on a Unix socket in a private folder of this process, and for each
// connection there connects to 127.0.0.1:PORT in that namespace, says 'K' once connected (so the
// caller can tell "refused" from an empty answer), then copies bytes. It ends with its stdin
// (this process gone) or when the command it serves ends (stopRelay).
const RELAY_SOURCE = `
const net = require('net');
const [sock, port] = process.argv.slice(1);
const server = net.createServer((c) => {
  c.on('error', () => {});
  const s = net.connect({ host: '127.0.0.1', port: Number(port), noDelay: true }, () => { c.write('K'); c.pipe(s); s.pipe(c); });
  s.on('error', () => c.destroy());
  s.on('close', () => c.destroy());
  c.on('close', () => s.destroy());
});
server.listen(sock, () => process.stdout.write('L'));
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

interface Relay {
  /** The tracked command whose namespace it is in: it stops when that command ends. */
  owner: number;
  socket: Promise<string>;
  child: ReturnType<typeof spawn>;
}
/** One relay per network namespace and port, reused by every connection to it. */
const relays = new Map<string, Relay>();
let socketDir: string | undefined;

function stopRelay(key: string): void {
  const r = relays.get(key);
  if (!r) return;
  relays.delete(key);
  r.child.kill('SIGKILL');
}

/**
 * Opens a byte stream to 127.0.0.1:`port` inside the sandbox at `root`. Rejects with
 * PortUnreachableError when no running command of the sandbox listens there.
 */
export async function connectSandboxPort(root: string, port: number): Promise<Duplex> {
  const pids = [...(running.get(keyOf(root)) ?? [])];
  const hostNs = await netnsOf('self');
  if (!hostNs) throw new Error("cannot read this process's network namespace (/proc)");
  const seen = new Set<string>();
  for (const pid of pids) {
    const inner = await namespacedDescendant(pid, hostNs);
    if (inner === undefined) continue;
    const ns = await netnsOf(inner);
    if (!ns || seen.has(ns)) continue;
    seen.add(ns);
    if (await listensOn(inner, port)) return dial(await relayFor(pid, inner, ns, port), port);
  }
  throw new PortUnreachableError(port, pids.length === 0 ? 'no command is running in it' : '');
}

async function relayFor(owner: number, pid: number, ns: string, port: number): Promise<string> {
  const key = `${ns}:${port}`;
  let r = relays.get(key);
  if (!r) {
    const nsenter = findExecutable('nsenter');
    if (!nsenter) throw new Error('nsenter (util-linux) is needed to reach ports inside confined sandboxes');
    socketDir ??= await fs.mkdtemp(path.join(os.tmpdir(), 'slipway-relays-'));
    const socket = path.join(socketDir, `${ns.replace(/\D/g, '')}-${port}.sock`);
    await fs.rm(socket, { force: true });
    // Root may enter any namespace; another user enters the sandbox's user namespace (its own) first.
    const enter = process.getuid?.() === 0 ? ['--net'] : ['--user', '--net', '--preserve-credentials'];
    const child = spawn(nsenter, [`--target=${pid}`, ...enter, '--', process.execPath, '-e', RELAY_SOURCE, socket, String(port)], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: '/usr/bin:/bin' },
    });
    const created: Relay = {
      owner,
      child,
      socket: new Promise<string>((resolve, reject) => {
        let stderr = '';
        child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString('utf8')).slice(-500)));
        child.once('error', reject);
        child.once('exit', (code) => reject(new PortUnreachableError(port, stderr.trim() || `relay exited with ${code}`)));
        child.stdout!.once('data', () => resolve(socket));
      }),
    };
    child.once('exit', () => {
      if (relays.get(key) === created) relays.delete(key);
    });
    relays.set(key, (r = created));
  }
  return r.socket;
}

function dial(socket: string, port: number): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    const c = net.connect(socket);
    const failed = (e?: Error) => reject(new PortUnreachableError(port, e?.message ?? 'connection refused'));
    c.once('error', failed);
    c.once('close', failed);
    c.once('readable', function first() {
      const head = c.read(1) as Buffer | null;
      if (head === null) return void c.once('readable', first);
      c.off('error', failed);
      c.off('close', failed);
      if (head.toString() !== 'K') {
        c.destroy();
        return reject(new PortUnreachableError(port, 'relay failed'));
      }
      resolve(c);
    });
  });
}
