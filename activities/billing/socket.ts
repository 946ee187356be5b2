/**
 * The embedded billing database shared by its holder. PGlite lives inside one process (`slipway api`), so
 * while that runs the operator's CLI (`slipway token revoke`, `account set --disable`, ...)
 * reaches the same database through the holder: one statement per request over HTTP on a Unix
 * socket in the billing database folder (folder 0700, socket 0600: the operator's user only; no sandbox
 * sees `$SLIPWAY_HOME` at all, ADR 0006). Rows travel with V8's serializer, so dates and numbers
 * arrive as the billing database code expects, and database errors keep their SQLSTATE code and detail.
 *
 * Statements run one by one between the holder's own queries; there are no transactions over the
 * socket (the operator verbs need none), so a client can never leave the holder inside one.
 */
import { promises as fs } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import v8 from 'node:v8';
import type { Db, QueryResult } from './db';

/** Where the holder of the embedded billing database in `billingDir` listens. */
export const billingSocketPath = (billingDir: string): string => path.join(billingDir, 'slipway.sock');
/** sun_path is 108 bytes with its NUL. */
export const MAX_SOCKET_PATH_BYTES = 107;
const MAX_REQUEST_BYTES = 16 * 1024 * 1024;

interface QueryRequest {
  sql: string;
  params?: unknown[];
  /** exec(): several statements without parameters. */
  exec?: boolean;
}
type QueryResponse = { ok: QueryResult<unknown> } | { error: { message: string; code?: string; detail?: string } };

export class BillingSocketError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'BillingSocketError';
  }
}

/**
 * Serves `db` on `socketPath`, replacing a socket left by a holder that died (the caller holds
 * the billing database lock, so nothing else can be listening there).
 */
export async function serveBillingSocket(db: Db, socketPath: string): Promise<{ close(): Promise<void> }> {
  if (Buffer.byteLength(socketPath) > MAX_SOCKET_PATH_BYTES) {
    throw new BillingSocketError(`the billing database socket path ${socketPath} is longer than ${MAX_SOCKET_PATH_BYTES} bytes; choose a shorter SLIPWAY_HOME`);
  }
  await fs.rm(socketPath, { force: true });
  const server = http.createServer((req, res) => {
    const reply = (status: number, body: QueryResponse) => {
      res.writeHead(status, { 'content-type': 'application/x-v8-serialized' }).end(v8.serialize(body));
    };
    if (req.method !== 'POST' || req.url !== '/query') return reply(404, { error: { message: 'POST /query only' } });
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_REQUEST_BYTES) req.destroy();
      else chunks.push(c);
    });
    req.on('end', () => {
      void (async () => {
        let q: QueryRequest;
        try {
          q = v8.deserialize(Buffer.concat(chunks)) as QueryRequest;
          if (typeof q?.sql !== 'string') throw new Error('sql must be a string');
        } catch (e) {
          return reply(400, { error: { message: `bad request: ${(e as Error).message}` } });
        }
        try {
          if (q.exec) {
            await db.exec(q.sql);
            reply(200, { ok: { rows: [], rowCount: 0 } });
          } else {
            reply(200, { ok: await db.query(q.sql, q.params) });
          }
        } catch (e) {
          const err = e as { message: string; code?: unknown; detail?: unknown };
          reply(200, { error: { message: err.message, code: typeof err.code === 'string' ? err.code : undefined, detail: typeof err.detail === 'string' ? err.detail : undefined } });
        }
      })();
    });
  });
  // The folder is made private first, so nobody else can reach the socket before its chmod.
  await fs.chmod(path.dirname(socketPath), 0o700);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => {
      server.off('error', reject);
      resolve();
    });
  });
  await fs.chmod(socketPath, 0o600);
  return {
    close: async () => {
      await new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await fs.rm(socketPath, { force: true });
    },
  };
}

/** A Db whose statements run in the process that holds the embedded billing database. */
export function connectBillingSocket(socketPath: string): Db {
  const send = (q: QueryRequest): Promise<QueryResult<never>> =>
    new Promise((resolve, reject) => {
      const req = http.request({ socketPath, path: '/query', method: 'POST', headers: { 'content-type': 'application/x-v8-serialized' } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('error', reject);
        res.on('end', () => {
          let body: QueryResponse;
          try {
            body = v8.deserialize(Buffer.concat(chunks)) as QueryResponse;
          } catch {
            return reject(new BillingSocketError(`the billing database's holder answered ${res.statusCode} with an unreadable body`));
          }
          if ('ok' in body) return resolve(body.ok as QueryResult<never>);
          // Shaped like pg's errors, so callers read the SQLSTATE as they do for a direct connection.
          reject(Object.assign(new Error(body.error.message), { code: body.error.code, detail: body.error.detail }));
        });
      });
      req.on('error', (e: NodeJS.ErrnoException) => reject(new BillingSocketError(`cannot reach the billing database's holder at ${socketPath}: ${e.code ?? e.message}`)));
      req.end(v8.serialize(q));
    });
  return {
    engine: 'pglite',
    query: (sql, params) => send({ sql, params }),
    exec: async (sql) => {
      await send({ sql, exec: true });
    },
    transaction: () => Promise.reject(new BillingSocketError('transactions are not available through the billing database socket; stop `slipway api` first')),
    close: async () => undefined,
  };
}
