/**
 * The preview proxy (ADR 0015): requests whose Host is `<id>-<port>.<preview domain>` go to
 * that sandbox's port, through the provider's connectPort (a relay inside the sandbox's own
 * network; never a connection from this process to a host address). HTTP requests are
 * forwarded with node's HTTP client over that stream; WebSocket (and other) upgrades are
 * forwarded as bytes after the request head.
 *
 * Access: Authorization: Bearer <the sandbox account's token>, or a signed link
 * (`?slipway_preview=<token>`, which answers 303 with a host-only HttpOnly cookie and the URL
 * without it), or that cookie. The credential never reaches the app in the sandbox.
 */
import http, { type IncomingHttpHeaders, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import { cookieValue, parsePreviewHost, PREVIEW_COOKIE, PREVIEW_LINK_PARAM, withoutCookie } from '../activities/service/preview';
import { ApiError, type SandboxService } from './service';

export interface PreviewCounters {
  request(kind: 'http' | 'upgrade', outcome: string): void;
  bytes(direction: 'in' | 'out', n: number): void;
}

type Target = { sandboxId: string; port: number };

/** Scheme and port of the API as the caller reached it: preview URLs use the same. */
export const requestOrigin = (req: { protocol: string; headers: IncomingHttpHeaders }) => ({ scheme: req.protocol, port: /:(\d+)$/.exec(req.headers.host ?? '')?.[1] });

/** The preview a request is for, or undefined when it is an API request. */
export function previewTarget(service: SandboxService, req: IncomingMessage): Target | undefined {
  const domain = service.previewDomain;
  return domain === undefined ? undefined : parsePreviewHost(req.headers.host, domain);
}

// Hop-by-hop headers (RFC 9110 7.6.1) and the preview's own credentials stay here.
const HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'authorization']);

function forwardHeaders(headers: IncomingHttpHeaders, keepUpgrade: boolean): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(headers)) {
    if (v === undefined || (HOP.has(k) && !(keepUpgrade && (k === 'upgrade' || k === 'connection')))) continue;
    if (k === 'cookie') {
      const rest = withoutCookie(Array.isArray(v) ? v.join('; ') : v, PREVIEW_COOKIE);
      if (rest) out.cookie = rest;
      continue;
    }
    out[k] = v;
  }
  return out;
}

/** The URL without the link parameter. */
function stripLink(url: string): { path: string; link: string | undefined } {
  const u = new URL(url, 'http://x');
  const link = u.searchParams.get(PREVIEW_LINK_PARAM) ?? undefined;
  u.searchParams.delete(PREVIEW_LINK_PARAM);
  return { path: `${u.pathname}${u.search}`, link };
}

const bearerOf = (req: IncomingMessage) => /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '')?.[1];

/**
 * Checks the request's credential for this preview. Returns the link token to set as a cookie
 * (first use of a signed link), or undefined when the request may go on as it is.
 */
async function authorize(service: SandboxService, req: IncomingMessage, t: Target, link: string | undefined): Promise<{ setCookie?: { token: string; maxAgeSeconds: number } }> {
  if (link !== undefined) {
    const check = service.checkPreviewLink(link, t.sandboxId, t.port);
    if (!check.ok) throw new ApiError(401, 'invalid_link', check.reason === 'expired' ? 'this preview link has expired; ask for a new one' : 'this preview link is not valid');
    return { setCookie: { token: link, maxAgeSeconds: Math.max(1, Math.floor((check.expiresAtMs - Date.now()) / 1000)) } };
  }
  const token = bearerOf(req);
  if (token !== undefined) {
    await service.authorizePreviewBearer(token, t.sandboxId);
    return {};
  }
  const cookie = cookieValue(req.headers.cookie, PREVIEW_COOKIE);
  if (cookie !== undefined) {
    const check = service.checkPreviewLink(cookie, t.sandboxId, t.port);
    if (!check.ok) throw new ApiError(401, 'invalid_link', check.reason === 'expired' ? 'this preview link has expired; ask for a new one' : 'this preview link is not valid');
    return {};
  }
  throw new ApiError(401, 'unauthorized', 'a preview needs the account token (Authorization: Bearer) or a signed link');
}

const errorJson = (e: ApiError) => JSON.stringify({ error: { code: e.code, message: e.message } });

function asApiError(e: unknown): ApiError {
  return e instanceof ApiError ? e : new ApiError(502, 'bad_gateway', 'the preview could not be reached');
}

/** Serves one preview HTTP request (the caller has hijacked fastify's reply). */
export async function handlePreviewRequest(service: SandboxService, t: Target, req: IncomingMessage, res: ServerResponse, counters?: PreviewCounters): Promise<void> {
  let release: (() => void) | undefined;
  try {
    const { path, link } = stripLink(req.url ?? '/');
    const auth = await authorize(service, req, t, link);
    if (auth.setCookie) {
      // The link becomes a cookie of this origin only; the address bar loses the token.
      res.writeHead(303, {
        location: path,
        'set-cookie': `${PREVIEW_COOKIE}=${auth.setCookie.token}; Max-Age=${auth.setCookie.maxAgeSeconds}; Path=/; HttpOnly; SameSite=Lax`,
        'cache-control': 'no-store',
        'content-length': '0',
      });
      res.end();
      req.resume();
      counters?.request('http', 'link');
      return;
    }
    const conn = await service.connectPreview(t.sandboxId, t.port);
    release = conn.release;
    const stream = socketLike(conn.stream);
    const countIn = (d: Buffer) => counters?.bytes('in', d.length);
    await new Promise<void>((resolve, reject) => {
      const upstream = http.request({
        method: req.method,
        path,
        headers: { ...forwardHeaders(req.headers, false), connection: 'close' },
        createConnection: () => stream as never,
      });
      upstream.on('response', (up) => {
        const headers: Record<string, string | string[]> = {};
        for (const [k, v] of Object.entries(up.headers)) if (v !== undefined && !HOP.has(k)) headers[k] = v;
        res.writeHead(up.statusCode ?? 502, up.statusMessage, headers);
        up.on('data', (d: Buffer) => counters?.bytes('out', d.length));
        up.pipe(res);
        up.on('end', resolve);
        up.on('error', reject);
      });
      upstream.on('error', reject);
      res.on('close', () => {
        stream.destroy();
        resolve();
      });
      req.on('data', countIn);
      req.pipe(upstream);
    });
    counters?.request('http', 'proxied');
    // The app may answer before it has read the whole body (and close, or stop reading). The
    // rest must still be read off this client connection: piped into a stream that no longer
    // drains, it would hold the socket paused and the next keep-alive request would hang.
    req.unpipe();
    req.off('data', countIn);
    stream.destroy();
    if (!req.complete) req.resume();
  } catch (e) {
    const err = asApiError(e);
    counters?.request('http', err.code);
    if (!res.headersSent) {
      res.writeHead(err.status, {
        'content-type': 'application/json; charset=utf-8',
        ...(err.status === 401 ? { 'www-authenticate': 'Bearer' } : {}),
        ...(err.retryAfterSeconds !== undefined ? { 'retry-after': String(Math.max(1, Math.ceil(err.retryAfterSeconds))) } : {}),
      });
      res.end(errorJson(err));
    } else {
      res.destroy();
    }
    req.resume();
  } finally {
    release?.();
  }
}

/** Forwards an upgrade (WebSocket) to the sandbox's port as bytes, after the same checks. */
export async function handlePreviewUpgrade(service: SandboxService, t: Target, req: IncomingMessage, socket: Duplex, head: Buffer, counters?: PreviewCounters): Promise<void> {
  socket.on('error', () => undefined);
  let release: (() => void) | undefined;
  try {
    const { path, link } = stripLink(req.url ?? '/');
    // A WebSocket client does not follow a redirect: a link is taken as it is here.
    await authorize(service, req, t, link);
    const conn = await service.connectPreview(t.sandboxId, t.port);
    release = conn.release;
    const upstream = conn.stream;
    const lines = [`${req.method} ${path} HTTP/1.1`];
    for (const [k, v] of Object.entries(forwardHeaders(req.headers, true))) for (const one of Array.isArray(v) ? v : [v]) lines.push(`${k}: ${one}`);
    upstream.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (head.length > 0) upstream.write(head);
    upstream.on('data', (d: Buffer) => counters?.bytes('out', d.length));
    socket.on('data', (d: Buffer) => counters?.bytes('in', d.length));
    upstream.pipe(socket);
    socket.pipe(upstream);
    counters?.request('upgrade', 'proxied');
    await new Promise<void>((resolve) => {
      const done = () => {
        upstream.destroy();
        socket.destroy();
        resolve();
      };
      upstream.on('close', done);
      socket.on('close', done);
      upstream.on('error', done);
    });
  } catch (e) {
    const err = asApiError(e);
    counters?.request('upgrade', err.code);
    const body = errorJson(err);
    socket.end(`HTTP/1.1 ${err.status} ${http.STATUS_CODES[err.status] ?? 'Error'}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
  } finally {
    release?.();
  }
}

/** node's HTTP client calls a few net.Socket methods on its connection; a relay stream has none. */
function socketLike(stream: Duplex): Duplex {
  const s = stream as Duplex & Record<string, unknown>;
  for (const m of ['setNoDelay', 'setKeepAlive', 'setTimeout', 'ref', 'unref']) if (typeof s[m] !== 'function') s[m] = () => s;
  return stream;
}
