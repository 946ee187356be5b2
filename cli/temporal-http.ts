/**
 * Temporal's frontend HTTP API with node:http: what `slipway status` and `list` need
 * (list, describe, query, the close event), without loading the Temporal SDK, which alone takes
 * longer to load than these commands may take in all (ADR 0024). Payloads are asked for in full
 * form (`noPayloadShorthand`) and decoded like the SDK's default converter does (json/plain,
 * binary/null), after the same encryption codec as every Slipway client when a key is set.
 */
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import type { Payload } from '@temporalio/common';
import type { EncryptionCodec } from '../workers/payload-codec';
import { temporalEndpointsFile, type SlipwaySettings } from '../lib/settings';
import { CliError, EXIT } from './exit-codes';

/** Where the HTTP API is, when it is known; else the SDK path is taken. */
export interface HttpEndpoint {
  /** `http://host:port`, no trailing slash. */
  baseUrl: string;
  namespace: string;
}

/** `host:port` or an http(s) URL; anything else is bad input naming the variable. */
export function parseHttpAddress(value: string, variable: string): string {
  const v = value.trim().replace(/\/+$/, '');
  const url = /^https?:\/\//.test(v) ? v : `http://${v}`;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new CliError(`${variable}: "${value}" is not host:port or an http(s) URL`, EXIT.badInput);
  }
  if (!parsed.port && !/^https?:\/\//.test(v)) throw new CliError(`${variable}: "${value}" has no port (host:port)`, EXIT.badInput);
  if (parsed.pathname !== '/' || parsed.search || parsed.hash) throw new CliError(`${variable}: "${value}" must be host:port or a URL without a path`, EXIT.badInput);
  return `${parsed.protocol}//${parsed.host}`;
}

/**
 * The HTTP API of the server this process would talk to: TEMPORAL_HTTP_ADDRESS beside
 * TEMPORAL_ADDRESS, or the embedded server's own record (written by workers/dev-server.ts) when
 * it is for the port Slipway uses. Undefined when unknown.
 */
export function httpEndpoint(settings: SlipwaySettings): HttpEndpoint | undefined {
  if (settings.temporalAddress) {
    return settings.temporalHttpAddress ? { baseUrl: parseHttpAddress(settings.temporalHttpAddress, 'TEMPORAL_HTTP_ADDRESS'), namespace: settings.namespace } : undefined;
  }
  let record: { address?: unknown; httpAddress?: unknown };
  try {
    record = JSON.parse(readFileSync(temporalEndpointsFile(settings.dataDir), 'utf8')) as typeof record;
  } catch {
    return undefined; // no embedded server recorded (or one from before this record existed)
  }
  if (record.address !== `127.0.0.1:${settings.embeddedPort}` || typeof record.httpAddress !== 'string' || !/^127\.0\.0\.1:\d+$/.test(record.httpAddress)) return undefined;
  return { baseUrl: `http://${record.httpAddress}`, namespace: settings.namespace };
}

/** The server answered with an error (gRPC status `code`, e.g. 5 NOT_FOUND). */
export class TemporalHttpError extends Error {
  constructor(
    message: string,
    readonly code: number | undefined,
    readonly httpStatus: number,
  ) {
    super(message);
    this.name = 'TemporalHttpError';
  }
}
export const GRPC_NOT_FOUND = 5;

/** A payload as the HTTP API shows it in full form: metadata values and data in base64. */
export interface JsonPayload {
  metadata?: Record<string, string>;
  data?: string;
}

export class TemporalHttp {
  constructor(
    private readonly endpoint: HttpEndpoint,
    private readonly codec?: EncryptionCodec,
  ) {}

  /** GET or POST `path` under the namespace; JSON in and out. */
  async call<T>(path: string, opts: { query?: Record<string, string | undefined>; body?: unknown; timeoutMs?: number } = {}): Promise<T> {
    const url = new URL(`${this.endpoint.baseUrl}/api/v1/namespaces/${encodeURIComponent(this.endpoint.namespace)}${path}`);
    url.searchParams.set('noPayloadShorthand', 'true');
    for (const [k, v] of Object.entries(opts.query ?? {})) if (v !== undefined) url.searchParams.set(k, v);
    const { status, text } = await request(url, opts.body === undefined ? undefined : JSON.stringify(opts.body), opts.timeoutMs);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new TemporalHttpError(`Temporal HTTP API ${url.pathname}: HTTP ${status}, not JSON: ${text.slice(0, 200)}`, undefined, status);
    }
    if (status < 200 || status >= 300) {
      const e = json as { code?: number; message?: string };
      throw new TemporalHttpError(e.message ?? `Temporal HTTP API ${url.pathname}: HTTP ${status}`, e.code, status);
    }
    return json as T;
  }

  /** One payload's value, as the SDK's default data converter (after Slipway's codec) gives it. */
  async decode(payload: JsonPayload | undefined): Promise<unknown> {
    if (!payload) return undefined;
    const raw: Payload = {
      metadata: Object.fromEntries(Object.entries(payload.metadata ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64')])),
      data: Buffer.from(payload.data ?? '', 'base64'),
    };
    const [decoded] = this.codec ? await this.codec.decode([raw]) : [raw];
    return fromPayload(decoded!);
  }
}

/** The SDK's default payload converters, the ones Slipway's payloads use: binary/null and json/plain. */
export function fromPayload(payload: Payload): unknown {
  const encoding = payload.metadata?.encoding ? Buffer.from(payload.metadata.encoding).toString('utf8') : undefined;
  if (encoding === 'binary/null') return undefined;
  if (encoding === 'json/plain') {
    const text = Buffer.from(payload.data ?? new Uint8Array(0)).toString('utf8');
    return text === '' ? undefined : JSON.parse(text);
  }
  throw new Error(`payload with encoding "${encoding ?? '(none)'}": not one Slipway writes (json/plain, binary/null)`);
}

/** A protobuf JSON timestamp (`2026-01-02T03:04:05.123456789Z`) to a Date, cut to milliseconds as the SDK does. */
export function timestampToDate(ts: string): Date {
  return new Date(ts.replace(/(\.\d{3})\d*Z$/, '$1Z'));
}

/** The server could not be reached at all (refused, reset, unknown host): the address may be stale. */
export class TemporalUnreachableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TemporalUnreachableError';
  }
}

/**
 * One request with node:http(s), not `fetch`: fetch loads undici on first use, which costs these
 * short-lived commands more CPU than the rest of their work here.
 */
function request(url: URL, body: string | undefined, timeoutMs: number | undefined): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = (url.protocol === 'https:' ? https : http).request(
      url,
      { method: body === undefined ? 'GET' : 'POST', headers: body === undefined ? {} : { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      },
    );
    if (timeoutMs) req.setTimeout(timeoutMs, () => req.destroy(new Error(`Temporal HTTP API: no answer within ${timeoutMs} ms`)));
    req.on('error', (e: NodeJS.ErrnoException) => {
      const unreachable = ['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'EHOSTUNREACH', 'ENETUNREACH', 'EAI_AGAIN'].includes(e.code ?? '');
      reject(unreachable ? new TemporalUnreachableError(`Temporal HTTP API at ${url.host}: ${e.message}`) : e);
    });
    req.end(body);
  });
}
