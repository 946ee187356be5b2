/**
 * `slipway codec-server`: a remote codec endpoint for the Temporal Web UI and CLI
 * (`temporal workflow show --codec-endpoint URL`), so people who hold the key can read encrypted
 * histories. POST /decode and /encode take and return `{"payloads": [{"metadata": {k: base64},
 * "data": base64}]}` (Temporal's codec-server protocol).
 *
 * It decrypts for whoever can reach it, so it listens on 127.0.0.1 by default and answers
 * browsers only from the allowed origins (the Web UI's; CORS with credentials for the UI's
 * "include cross-origin credentials" option). A request whose Origin is not allowed gets 403;
 * requests without an Origin (the Temporal CLI) are served.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Payload, PayloadCodec } from '@temporalio/common';

export interface CodecServerOptions {
  codec: PayloadCodec;
  host?: string;
  port?: number;
  /** Browser origins allowed to call (e.g. `http://localhost:8233`, the embedded Web UI). */
  allowedOrigins: string[];
  /** Largest request body (bytes); default 64 MiB. */
  maxBodyBytes?: number;
}

export interface CodecServer {
  url: string;
  close(): Promise<void>;
}

interface JsonPayload {
  metadata?: Record<string, string> | null;
  data?: string | null;
}

function fromJson(p: JsonPayload): Payload {
  if (typeof p !== 'object' || p === null) throw new TypeError('each payload must be an object');
  const metadata: Record<string, Uint8Array> = {};
  for (const [k, v] of Object.entries(p.metadata ?? {})) {
    if (typeof v !== 'string') throw new TypeError(`metadata "${k}" must be a base64 string`);
    metadata[k] = Buffer.from(v, 'base64');
  }
  if (p.data != null && typeof p.data !== 'string') throw new TypeError('data must be a base64 string');
  return { metadata, data: p.data ? Buffer.from(p.data, 'base64') : new Uint8Array(0) };
}

function toJson(p: Payload): JsonPayload {
  return {
    metadata: Object.fromEntries(Object.entries(p.metadata ?? {}).map(([k, v]) => [k, Buffer.from(v ?? new Uint8Array(0)).toString('base64')])),
    data: Buffer.from(p.data ?? new Uint8Array(0)).toString('base64'),
  };
}

export async function startCodecServer(opts: CodecServerOptions): Promise<CodecServer> {
  const allowed = new Set(opts.allowedOrigins.map((o) => o.replace(/\/+$/, '')));
  const maxBody = opts.maxBodyBytes ?? 64 * 1024 * 1024;

  const server = http.createServer((req, res) => {
    const origin = req.headers.origin;
    if (origin !== undefined) {
      if (!allowed.has(origin)) {
        res.writeHead(403, { 'content-type': 'text/plain' }).end(`origin ${origin} is not allowed (slipway codec-server --origin)\n`);
        return;
      }
      res.setHeader('access-control-allow-origin', origin);
      res.setHeader('access-control-allow-credentials', 'true');
      res.setHeader('vary', 'Origin');
    }
    const route = (req.url ?? '').split('?')[0].replace(/\/+$/, '');
    if (req.method === 'OPTIONS') {
      res.writeHead(204, {
        'access-control-allow-methods': 'POST, OPTIONS',
        'access-control-allow-headers': 'content-type, x-namespace, authorization',
        'access-control-max-age': '600',
      }).end();
      return;
    }
    if (req.method !== 'POST' || (route !== '/decode' && route !== '/encode')) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('POST /decode or /encode\n');
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let tooBig = false;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBody) {
        tooBig = true;
        req.destroy();
        return;
      }
      chunks.push(chunk);
    });
    req.on('error', () => undefined);
    req.on('end', () => {
      if (tooBig) return;
      void (async () => {
        let payloads: Payload[];
        try {
          const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { payloads?: JsonPayload[] };
          if (!Array.isArray(body?.payloads)) throw new TypeError('expected {"payloads": [...]}');
          payloads = body.payloads.map(fromJson);
        } catch (e) {
          res.writeHead(400, { 'content-type': 'text/plain' }).end(`bad request: ${(e as Error).message}\n`);
          return;
        }
        try {
          const out = route === '/decode' ? await opts.codec.decode(payloads) : await opts.codec.encode(payloads);
          res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ payloads: out.map(toJson) }));
        } catch (e) {
          // Codec errors name a key id at most, never a key.
          res.writeHead(400, { 'content-type': 'text/plain' }).end(`${(e as Error).message}\n`);
        }
      })();
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port ?? 8234, opts.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return {
    url: `http://${host}:${address.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
