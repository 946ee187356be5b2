/**
 * A property-based fuzzer of the served OpenAPI document (schemathesis' idea, in TypeScript):
 * for every operation, requests generated from the document's own schemas, valid and broken
 * (missing fields, wrong types, unknown keys, hostile paths and ids, odd query strings), sent
 * over real HTTP to the real service. Properties: no 5xx, every status is one the document
 * lists for the operation, and every JSON body matches the schema documented for that status.
 * Seeded (SLIPWAY_FUZZ_SEED to replay; the seed is printed), bounded by a request count.
 */
import { randomBytes } from 'node:crypto';
import { makeSshHostKey } from '../../api/ssh-server';
import { Ajv2020 } from 'ajv/dist/2020';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startServiceHarness, type ServiceHarness, type TestAccount } from './harness';

type Schema = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
type Doc = { paths: Record<string, Record<string, Schema>>; components: { schemas: Record<string, Schema> } };

const SEED = Number(process.env.SLIPWAY_FUZZ_SEED ?? Date.now() % 1_000_000);
const PER_OPERATION = Number(process.env.SLIPWAY_FUZZ_RUNS ?? 60);
/** Every answer the fuzzer asks for is quick (short commands, small bodies); a slower one is a finding. */
const ANSWER_WITHIN_MS = 30_000;

/** mulberry32: small, seedable, good enough to pick cases. */
function rng(seed: number) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = <T>(xs: readonly T[]): T => xs[int(0, xs.length - 1)]!;
  const chance = (p: number) => next() < p;
  return { next, int, pick, chance };
}
type Rng = ReturnType<typeof rng>;

const NASTY_STRINGS = ['', ' ', '\u0000', '../../etc/passwd', '%2e%2e', '.git/config', 'é'.repeat(200), '🙂', 'a'.repeat(5000), '{"a":1}', 'null', '-1', '1e309', 'sbx_aaaaaaaaaaaaaaaaaaaa', '\\', '\n'];
const randomString = (r: Rng, max = 40) =>
  r.chance(0.3)
    ? r.pick(NASTY_STRINGS)
    : Array.from({ length: r.int(0, max) }, () => String.fromCodePoint(r.chance(0.9) ? r.int(0x20, 0x7e) : r.int(0xa0, 0x2fff))).join('');

/** A value for `schema`: mostly valid, sometimes subtly or grossly wrong. */
function generate(r: Rng, schema: Schema, doc: Doc, depth = 0): unknown {
  if (schema.$ref) return generate(r, doc.components.schemas[String(schema.$ref).split('/').pop()!]!, doc, depth);
  if (r.chance(0.04) || depth > 4) return r.pick([null, 42, 'x', true, [], {}, -0.5, 1e12]);
  if (schema.anyOf || schema.oneOf) return generate(r, r.pick(schema.anyOf ?? schema.oneOf), doc, depth + 1);
  if (schema.enum) return r.chance(0.9) ? r.pick(schema.enum) : randomString(r, 10);
  if ('const' in schema) return schema.const;
  switch (schema.type) {
    case 'string':
      if (schema.format === 'uuid') return r.chance(0.8) ? crypto.randomUUID() : randomString(r, 36);
      if (schema.pattern && r.chance(0.5)) return undefined; // the caller substitutes a known-good value
      return randomString(r, Math.min(schema.maxLength ?? 40, 60));
    case 'number':
    case 'integer': {
      const lo = schema.minimum ?? schema.exclusiveMinimum ?? -10;
      const hi = Math.min(schema.maximum ?? 1000, 1000);
      const n = r.chance(0.85) ? lo + r.next() * (hi - lo) : r.pick([-1, 0, 1e9, 0.0001, hi + 1]);
      return schema.type === 'integer' ? Math.round(n) : n;
    }
    case 'boolean':
      return r.chance(0.5);
    case 'array':
      return Array.from({ length: r.int(0, Math.min(schema.maxItems ?? 3, 3)) }, () => generate(r, schema.items ?? {}, doc, depth + 1));
    case 'object': {
      const out: Record<string, unknown> = {};
      for (const [k, v] of Object.entries<Schema>(schema.properties ?? {})) {
        const required = (schema.required ?? []).includes(k);
        if (required ? r.chance(0.95) : r.chance(0.5)) out[k] = generate(r, v, doc, depth + 1);
      }
      if (schema.additionalProperties && typeof schema.additionalProperties === 'object' && r.chance(0.5)) {
        out[randomString(r, 8) || 'K'] = generate(r, schema.additionalProperties, doc, depth + 1);
      }
      if (r.chance(0.05)) out[`unknown_${r.int(0, 9)}`] = 1;
      return out;
    }
    default:
      return r.pick([null, 'x', 1, {}]);
  }
}

let h: ServiceHarness;
let a: TestAccount;
let sandboxId: string;
let doc: Doc;
const ajv = new Ajv2020({ strict: false, allErrors: true, validateFormats: false });

beforeAll(async () => {
  // Preview ports and the SSH broker on, so their routes are fuzzed too.
  h = await startServiceHarness({ preview: { key: randomBytes(32), domain: 'localhost' }, ssh: { host: '127.0.0.1', port: 0, hostKey: makeSshHostKey() } });
  a = await h.account({ limit: 2 });
  await a.profile({ name: 'linux' });
  sandboxId = (await a.api.create({ profile: 'linux' })).id;
  await h.waitFor(a.api, sandboxId, ['ready']);
  await a.api.exec(sandboxId, { command: 'sh', args: ['-c', 'mkfifo fifo; ln -s /etc/passwd out; mkdir -p dir'] });
  doc = (await (await fetch(new URL('/api/v1/openapi.json', h.url))).json()) as Doc;
});
afterAll(async () => {
  await h?.stop();
});

/** Known-good values where a pattern would be hard to hit at random. */
const fixBody = (r: Rng, op: string, body: unknown): unknown => {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return body;
  const b = body as Record<string, unknown>;
  if (op === 'createSandbox' && (b.profile === undefined || r.chance(0.5))) b.profile = r.pick(['linux', 'linux', 'nope', randomString(r, 5)]);
  if (op === 'execInSandbox') {
    // Never a real program picked at random (this is a sandbox, but keep the run quiet and quick).
    if (b.command === undefined || r.chance(0.7)) b.command = r.pick(['true', 'echo', 'printf', 'cat', 'fz-no-such-program', '/bin/false', 'a=b', '-x']);
    if (typeof b.timeout_seconds === 'number' || r.chance(0.5)) b.timeout_seconds = r.pick([0.2, 1, 2, -1]);
    if (b.cwd !== undefined && r.chance(0.5)) b.cwd = r.pick(['.', 'src', 'dir', 'no-such', '../..', 'README.md', 'fifo']);
    if (b.command === 'cat' && b.stdin === undefined) b.stdin = 'x';
  }
  return b;
};

const filePaths = (r: Rng) =>
  r.pick([
    'README.md',
    'src/a.txt',
    'fifo',
    'out',
    'dir',
    '.git/config',
    '.slipway/grants.json',
    `new/${r.int(0, 99)}.txt`,
    'x'.repeat(r.int(250, 300)),
    '..%2f..%2fetc%2fpasswd',
    '%2e%2e/%2e%2e/x',
    '%00',
    'a%zz',
    encodeURIComponent(randomString(r, 30)) || 'e',
  ]);

const ids = (r: Rng, real: string) => r.pick([real, real, real, 'sbx_aaaaaaaaaaaaaaaaaaaa', 'nope', '%zz', encodeURIComponent(randomString(r, 20)) || 'x']);

describe('OpenAPI fuzz', () => {
  it(`keeps every answer documented and well-formed (seed ${SEED}, ${PER_OPERATION} requests per operation)`, async () => {
    console.log(`openapi fuzz seed: ${SEED} (SLIPWAY_FUZZ_SEED to replay)`);
    const r = rng(SEED);
    const failures: string[] = [];
    const statuses = new Map<string, number>();
    const ops: Array<{ path: string; method: string; op: Schema }> = [];
    for (const [p, methods] of Object.entries(doc.paths)) for (const [method, op] of Object.entries(methods)) ops.push({ path: p, method, op });
    // Destroying the sandbox would make the rest of the run a string of 409s: it goes last.
    ops.sort((x, y) => Number(x.op.operationId === 'destroySandbox') - Number(y.op.operationId === 'destroySandbox'));
    for (const { path: template, method, op } of ops) {
      for (let i = 0; i < PER_OPERATION; i++) {
        const realId = op.operationId === 'destroySandbox' && i < PER_OPERATION - 1 ? 'sbx_bbbbbbbbbbbbbbbbbbbb' : sandboxId;
        let url = template.replace('{id}', ids(r, realId)).replace('{path}', filePaths(r));
        const query = new URLSearchParams();
        for (const param of (op.parameters ?? []) as Schema[]) {
          if (param.in !== 'query' || !r.chance(0.6)) continue;
          const value = generate(r, param.schema ?? {}, doc);
          query.set(param.name, String(value ?? ''));
        }
        if (r.chance(0.05)) query.set(randomString(r, 6) || 'q', randomString(r, 6));
        if ([...query.keys()].length > 0) url += `?${query.toString()}`;
        const headers: Record<string, string> = {};
        if (op.operationId === 'introspectGrant') headers.authorization = `Bearer ${r.pick(['slpg_x', a.token, 'x'])}`;
        else if (!r.chance(0.03)) headers.authorization = `Bearer ${a.token}`;
        let body: string | Uint8Array | undefined;
        const content = op.requestBody?.content ?? {};
        if (content['application/json']) {
          headers['content-type'] = 'application/json';
          body = r.chance(0.05) ? r.pick(['{', '[]', 'null', '"x"', '{"a":']) : JSON.stringify(fixBody(r, op.operationId, generate(r, content['application/json'].schema, doc)) ?? {});
        } else if (content['application/octet-stream']) {
          headers['content-type'] = r.pick(['application/octet-stream', 'text/plain', 'application/json']);
          body = new Uint8Array(Buffer.from(randomString(r, 200)));
        }
        const label = `${method.toUpperCase()} ${url.slice(0, 160)}${body ? ` ${String(typeof body === 'string' ? body : '<bytes>').slice(0, 160)}` : ''}`;
        // A request that hangs is named, not left to the test's timeout (a pty exec once waited for an end of input).
        let res: Response;
        let text: string;
        try {
          res = await fetch(new URL(url, h.url), { method: method.toUpperCase(), headers, body, signal: AbortSignal.timeout(ANSWER_WITHIN_MS) });
          text = await res.text();
        } catch (e) {
          if ((e as Error).name !== 'TimeoutError') throw e;
          failures.push(`no answer within ${ANSWER_WITHIN_MS / 1000} s for ${label}`);
          continue;
        }
        statuses.set(`${op.operationId} ${res.status}`, (statuses.get(`${op.operationId} ${res.status}`) ?? 0) + 1);
        if (res.status >= 500 && res.status !== 503 && res.status !== 507) failures.push(`${res.status} for ${label}: ${text.slice(0, 300)}`);
        const documented = op.responses?.[String(res.status)];
        if (!documented) {
          failures.push(`undocumented ${res.status} for ${label}: ${text.slice(0, 200)}`);
          continue;
        }
        // A streamed answer (exec with stream: true) is NDJSON: each line is checked against its documented frame.
        const ndjson = (res.headers.get('content-type') ?? '').startsWith('application/x-ndjson');
        const mediaType = ndjson ? 'application/x-ndjson' : 'application/json';
        if (ndjson && !documented.content?.[mediaType]) failures.push(`undocumented NDJSON ${res.status} for ${label}`);
        const schema = documented.content?.[mediaType]?.schema;
        if (!schema) continue;
        let parsed: unknown[];
        try {
          parsed = ndjson ? text.split('\n').filter((l) => l !== '').map((l) => JSON.parse(l)) : [JSON.parse(text)];
        } catch {
          failures.push(`non-JSON ${res.status} for ${label}: ${text.slice(0, 200)}`);
          continue;
        }
        const target = schema.$ref ? doc.components.schemas[String(schema.$ref).split('/').pop()!]! : schema;
        const validate = ajv.compile(target);
        for (const item of parsed) if (!validate(item)) failures.push(`schema violation (${res.status}) for ${label}: ${ajv.errorsText(validate.errors)}`);
        if (res.status === 429 && !res.headers.get('retry-after')) failures.push(`429 without Retry-After for ${label}`);
      }
    }
    console.log(`openapi fuzz: ${[...statuses.values()].reduce((s, n) => s + n, 0)} requests; statuses ${JSON.stringify(Object.fromEntries([...statuses.entries()].sort()))}`);
    expect(failures).toEqual([]);
  });
});
