/**
 * Ports for the servers tests start on a port of their choosing (the embedded Temporal and its Web
 * UI, Postgres, etcd, kube-apiserver).
 *
 * `freePort()` (bind to port 0, close) hands out an ephemeral port, which any connect() or bind(0)
 * on the machine may take before the server binds it a second later: a clean-clone CI failed on a
 * dev server that could not bind its port. These come from below the ephemeral range
 * (net.ipv4.ip_local_port_range), which the kernel never hands out unasked; from a block of their
 * own per test worker (VITEST_POOL_ID, 0 in the main process), so two files running at once never
 * pick the same one; and each is checked free before it is handed out, for a server a file before
 * left behind.
 */
import { readFileSync } from 'node:fs';
import net from 'node:net';

const BLOCK = 1_000;

function firstEphemeralPort(): number {
  try {
    return Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]) || 32_768;
  } catch {
    return 32_768;
  }
}

const slot = Number(process.env.VITEST_POOL_ID ?? 0);
const base = Math.min(20_000, firstEphemeralPort() - 8 * BLOCK) + slot * BLOCK;
if (base < 1_024 || base + BLOCK > firstEphemeralPort()) throw new Error(`no room for test ports below the ephemeral range (worker ${slot})`);
// A random start: files run one after another in the same worker slot, each with a fresh counter.
let next = Math.floor(Math.random() * BLOCK);

const bindable = (port: number) =>
  new Promise<boolean>((resolve) => {
    const server = net.createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });

/** A port no other test worker hands out and nothing listens on now. */
export async function testPort(): Promise<number> {
  for (let tries = 0; tries < BLOCK; tries++) {
    const port = base + (next++ % BLOCK);
    if (await bindable(port)) return port;
  }
  throw new Error(`no free test port in ${base}-${base + BLOCK - 1}`);
}

/** Listens on a test port, so a server asked to bind it finds it taken; `close` frees it. */
export async function holdPort(): Promise<{ port: number; close: () => Promise<void> }> {
  const port = await testPort();
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return { port, close: () => new Promise((resolve) => server.close(() => resolve())) };
}
