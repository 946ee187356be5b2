/**
 * The API's end of owner tunnels (api/owner-tunnel.ts, docs/adr/0028) on a real HTTP server and
 * real WebSockets: an awaited id with a wrong proof is refused (401) and stays awaited; the right
 * proof gets in once; the same id again, an unknown id and an expired one are 404. And the owner's
 * end: frames the API sends right behind its 101 answer, in the same read, reach the bridge.
 */
import http from 'node:http';
import net, { type AddressInfo } from 'node:net';
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { PassThrough } from 'node:stream';
import WebSocket from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TunnelBroker } from '../api/owner-tunnel';
import { bridgePort, dialTunnel, FRAME, frame, tunnelKey, tunnelProof, TUNNEL_PATH } from '../activities/service/tunnel';

const key = tunnelKey(randomBytes(32));
let server: http.Server;
let broker: TunnelBroker;
let url: string;

beforeAll(async () => {
  server = http.createServer((_req, res) => res.end('plain'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  broker = new TunnelBroker(key, url);
  server.on('upgrade', (req, socket, head) => {
    if (!broker.handleUpgrade(req, socket, head)) socket.destroy();
  });
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

function status(id: string, proof: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`${url.replace('http', 'ws')}${TUNNEL_PATH}${id}`, { headers: { authorization: `Bearer ${proof}` } });
    ws.once('open', () => (ws.terminate(), resolve(101)));
    ws.once('unexpected-response', (_req, res) => (resolve(res.statusCode!), ws.terminate()));
    ws.once('error', (e) => (/hang up|ECONNRESET/.test(e.message) ? undefined : reject(e)));
  });
}

describe('owner tunnels at the API', () => {
  it('accepts an awaited id once, with its proof only', async () => {
    const id = randomUUID();
    const arrived = broker.expect(id, 60_000);
    expect(await status(id, tunnelProof(randomBytes(32), id))).toBe(401);
    expect(await status(id, 'not-even-base64url!')).toBe(401);
    // Still awaited after the refusals: the owner's dial gets in, and both ends talk.
    const owner = await dialTunnel(url, id, key);
    const api = await arrived;
    const got = new Promise<string>((r) => api.once('message', (d: Buffer) => r(d.toString())));
    owner.send(Buffer.from('hi'));
    expect(await got).toBe('hi');
    owner.close();
    expect(await status(id, tunnelProof(key, id))).toBe(404);
  });

  it('an unknown, cancelled or expired id is a 404', async () => {
    expect(await status(randomUUID(), 'x')).toBe(404);
    const cancelled = randomUUID();
    void broker.expect(cancelled, 60_000).catch(() => undefined);
    broker.cancel(cancelled);
    expect(await status(cancelled, tunnelProof(key, cancelled))).toBe(404);
    const expired = randomUUID();
    await expect(broker.expect(expired, 50)).rejects.toThrow(/did not open tunnel/);
    expect(await status(expired, tunnelProof(key, expired))).toBe(404);
    await expect(dialTunnel(url, expired, key)).rejects.toThrow(/HTTP 404/);
  });
});

describe("the owner's end of a tunnel", () => {
  it('a frame the API sends in the same write as its 101 answer reaches the port bridge (a preview request is not lost)', async () => {
    // An API host that answers the upgrade and sends its first data frame (a preview's HTTP
    // request) in one write: the owner's socket reads both at once, as it does under load.
    const request = Buffer.from('GET /page HTTP/1.1\r\nHost: x\r\n\r\n');
    const sockets = new Set<net.Socket>();
    const api = net.createServer((socket) => {
      sockets.add(socket);
      let head = '';
      socket.on('data', (d: Buffer) => {
        head += d.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        const wsKey = /sec-websocket-key: *(\S+)/i.exec(head)![1];
        const accept = createHash('sha1').update(`${wsKey}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
        const payload = frame(FRAME.data, request);
        socket.write(
          Buffer.concat([
            Buffer.from(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`),
            Buffer.from([0x82, payload.length]),
            payload,
          ]),
        );
      });
    });
    await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
    try {
      const apiUrl = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
      const sandboxPort = new PassThrough();
      const written: Buffer[] = [];
      sandboxPort.on('data', (d: Buffer) => written.push(d));
      let bridged: Promise<unknown> | undefined;
      const ws = await dialTunnel(apiUrl, randomUUID(), key, (open) => (bridged = bridgePort(open, sandboxPort)));
      try {
        await expect.poll(() => Buffer.concat(written).toString(), { timeout: 10_000 }).toBe(request.toString());
      } finally {
        ws.terminate();
      }
      await bridged;
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => api.close(() => r()));
    }
  });
});
