/**
 * The byte tunnel between a sandbox's owner and an API host on another host (docs/adr/0028):
 * interactive sessions (WebSocket, SSH) and preview ports of a sandbox another worker holds.
 *
 * The owner runs the session (or the port relay) and opens a WebSocket *outbound* to the API
 * process that asked for it, at `<api>/internal/v1/tunnels/<tunnel id>`. The tunnel id travels in
 * the call workflow's history; the proof does not: it is an HMAC of the id under a key derived
 * from SLIPWAY_PAYLOAD_KEY, which both ends already share (calls through a remote owner need it).
 * The API accepts each id once. Bytes never go through Temporal.
 *
 * Frames are binary WebSocket messages: one type byte, then the body.
 */
import { createHmac, hkdfSync, timingSafeEqual } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { finished } from 'node:stream/promises';
import WebSocket from 'ws';
import type { SandboxSession } from '../sandbox/provider';

export const TUNNEL_PATH = '/internal/v1/tunnels/';

/** API -> owner: `data` is stdin (or the port's bytes), `end` half-closes it. Owner -> API: the rest. */
export const FRAME = { data: 0, end: 1, resize: 2, signal: 3, kill: 4, stdout: 16, stderr: 17, exit: 18 } as const;

/** Output waits (the stream is paused) while this much is queued on the tunnel's socket. */
const HIGH_WATER_BYTES = 1024 * 1024;

export function frame(type: number, body?: Buffer | string): Buffer {
  const head = Buffer.from([type]);
  return body === undefined ? head : Buffer.concat([head, typeof body === 'string' ? Buffer.from(body) : body]);
}

/** The tunnel key: its own key, derived from the payload key, so the payload key itself is never used for two things. */
export function tunnelKey(payloadKey: Buffer): Buffer {
  return Buffer.from(hkdfSync('sha256', payloadKey, Buffer.alloc(0), 'slipway owner tunnel v1', 32));
}

export function tunnelProof(key: Buffer, tunnelId: string): string {
  return createHmac('sha256', key).update(tunnelId).digest('base64url');
}

export function proofMatches(key: Buffer, tunnelId: string, given: string | undefined): boolean {
  if (!given) return false;
  const want = Buffer.from(tunnelProof(key, tunnelId));
  const got = Buffer.from(given);
  return want.length === got.length && timingSafeEqual(want, got);
}

/** What the owner's end of a tunnel runs: a session, or a connection to a port inside the sandbox. */
export type TunnelTarget =
  | { kind: 'session'; command: string; args: string[]; env: Record<string, string>; cwd?: string; pty?: { cols: number; rows: number } }
  | { kind: 'port'; port: number };

export interface TunnelEnd {
  exitCode: number | null;
  signal: string | null;
}

/**
 * Opens the owner's end: a WebSocket to the API process, authenticated by the proof. `onOpen` runs
 * inside the socket's `open` event: the API may send its first frames (a preview's request) right
 * behind its 101 answer, in the same read, and `ws` emits them before an `await` on this promise
 * resumes; a `message` listener attached in `onOpen` gets them, one attached later may not.
 */
export async function dialTunnel(apiUrl: string, tunnelId: string, key: Buffer, onOpen?: (ws: WebSocket) => void): Promise<WebSocket> {
  const ws = new WebSocket(`${apiUrl.replace(/^http/, 'ws').replace(/\/+$/, '')}${TUNNEL_PATH}${encodeURIComponent(tunnelId)}`, {
    headers: { authorization: `Bearer ${tunnelProof(key, tunnelId)}` },
    perMessageDeflate: false,
    handshakeTimeout: 30_000,
  });
  await new Promise<void>((resolve, reject) => {
    ws.once('open', () => {
      onOpen?.(ws);
      resolve();
    });
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`the API host refused the tunnel (HTTP ${res.statusCode})`)));
  });
  return ws;
}

/** Sends a frame, pausing `source` while the socket holds more than HIGH_WATER_BYTES. */
function sender(ws: WebSocket) {
  return (type: number, body: Buffer | undefined, source?: NodeJS.ReadableStream) => {
    if (ws.readyState !== WebSocket.OPEN) return;
    ws.send(frame(type, body), () => {
      if (source?.isPaused() && ws.bufferedAmount < HIGH_WATER_BYTES) source.resume();
    });
    if (source && ws.bufferedAmount >= HIGH_WATER_BYTES) source.pause();
  };
}

/** Bridges a session over the tunnel until the command ended (then its exit frame) or the tunnel closed (then it is killed). */
export async function bridgeSession(ws: WebSocket, session: SandboxSession): Promise<TunnelEnd> {
  const send = sender(ws);
  session.stdout.on('data', (c: Buffer) => send(FRAME.stdout, c, session.stdout));
  session.stderr.on('data', (c: Buffer) => send(FRAME.stderr, c, session.stderr));
  session.stdin.on('error', () => undefined);
  ws.on('message', (d: Buffer) => {
    const body = d.subarray(1);
    switch (d[0]) {
      case FRAME.data:
        session.stdin.write(body);
        break;
      case FRAME.end:
        session.stdin.end();
        break;
      case FRAME.resize: {
        const { cols, rows } = JSON.parse(body.toString()) as { cols: number; rows: number };
        if (Number.isInteger(cols) && Number.isInteger(rows)) session.resize(cols, rows);
        break;
      }
      case FRAME.signal:
        session.signal(body.toString() as NodeJS.Signals);
        break;
      case FRAME.kill:
        session.kill();
        break;
    }
  });
  ws.once('close', () => session.kill());
  ws.on('error', () => session.kill());
  const [exit] = await Promise.all([session.exit, finished(session.stdout).catch(() => undefined), finished(session.stderr).catch(() => undefined)]);
  const end = { exitCode: exit.exitCode, signal: exit.signal };
  if (ws.readyState === WebSocket.OPEN) {
    ws.send(frame(FRAME.exit, JSON.stringify(end)));
    ws.close(1000);
  }
  return end;
}

/** Bridges a connection to a port inside the sandbox over the tunnel, both ways, until either side closes. */
export async function bridgePort(ws: WebSocket, stream: Duplex): Promise<TunnelEnd> {
  const send = sender(ws);
  stream.on('data', (c: Buffer) => send(FRAME.data, c, stream));
  stream.once('end', () => send(FRAME.end, undefined));
  stream.on('error', () => ws.close(1011));
  ws.on('message', (d: Buffer) => {
    if (d[0] === FRAME.data) stream.write(d.subarray(1));
    else if (d[0] === FRAME.end) stream.end();
  });
  await new Promise<void>((resolve) => {
    ws.once('close', () => resolve());
    stream.once('close', () => resolve());
  });
  stream.destroy();
  if (ws.readyState === WebSocket.OPEN) ws.close(1000);
  return { exitCode: null, signal: null };
}
