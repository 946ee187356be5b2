/**
 * Encrypted history payloads (workers/payload-codec.ts): the codec (round trip, tampering, key
 * rotation), its configuration (environment, `$SLIPWAY_HOME/.env`, malformed keys named and never
 * shown, exit 2 with nothing started), the codec server, and on the real Temporal test server: a
 * workflow started through Slipway's client path with a key set leaves no trace of a
 * secret-looking input in the raw history, while Slipway's client reads the result back.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Client, Connection } from '@temporalio/client';
import { defaultPayloadConverter, type Payload } from '@temporalio/common';
import { temporal } from '@temporalio/proto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { childEnv, runProcess } from '../activities/process';
import { gitEnv } from '../lib/git';
import { secretValuesWith, redact } from '../activities/redact';
import { startCodecServer } from '../workers/codec-server';
import { isPortOpen } from '../workers/dev-server';
import { testPort } from './helpers/ports';
import {
  ENCODING_ENCRYPTED,
  EncryptionCodec,
  METADATA_KEY_ID,
  PAYLOAD_KEY_VARIABLES,
  PayloadKeyError,
  deriveKeyId,
  parsePayloadKeyring,
  payloadKeyringFromEnv,
  slipwayDataConverter,
} from '../workers/payload-codec';
import { connectClient } from '../workers/temporal';
import { janitorWorkflow } from '../workflows/janitor';
import { slipway } from './helpers/cli';
import { withEnv } from './helpers/env';
import { tempDir } from './helpers/repo';
import { startTestWorker, type TestWorker } from './helpers/temporal';

const newKey = () => randomBytes(32).toString('base64');
const text = (b: Uint8Array | null | undefined) => Buffer.from(b ?? new Uint8Array(0)).toString('utf8');
const codecWith = (key: string, keyId?: string, keys?: string) => new EncryptionCodec(parsePayloadKeyring({ key, keyId, keys })!);
const toPayload = (value: unknown): Payload => defaultPayloadConverter.toPayload(value);

describe('EncryptionCodec', () => {
  it('round-trips payloads (metadata included), with a fresh IV each time and nothing readable in between', async () => {
    const codec = codecWith(newKey(), 'k1');
    const secret = `sk-live-${randomUUID()}`;
    const plain = [toPayload({ token: secret, n: 1 }), toPayload(null), toPayload(new Uint8Array([0, 1, 2, 255])), toPayload('')];
    const encoded = await codec.encode(plain);
    expect(encoded).toHaveLength(plain.length);
    for (const p of encoded) {
      expect(text(p.metadata?.encoding)).toBe(ENCODING_ENCRYPTED);
      expect(text(p.metadata?.[METADATA_KEY_ID])).toBe('k1');
      expect(Object.keys(p.metadata ?? {}).sort()).toEqual(['encoding', 'encryption-cipher', 'encryption-key-id']); // json/plain is hidden too
      expect(Buffer.from(p.data!).includes(Buffer.from(secret))).toBe(false);
      expect(Buffer.from(p.data!).includes(Buffer.from('json/plain'))).toBe(false);
    }
    const decoded = await codec.decode(encoded);
    expect(decoded.map((p) => defaultPayloadConverter.fromPayload(p))).toEqual([{ token: secret, n: 1 }, null, new Uint8Array([0, 1, 2, 255]), '']);
    expect(text(decoded[0].metadata?.encoding)).toBe('json/plain');
    // Same plaintext, different ciphertext (random IV).
    const [a, b] = await codec.encode([toPayload('same'), toPayload('same')]);
    expect(Buffer.from(a.data!).subarray(0, 12).equals(Buffer.from(b.data!).subarray(0, 12))).toBe(false);
    expect(Buffer.from(a.data!).equals(Buffer.from(b.data!))).toBe(false);
  });

  it('passes unencrypted payloads through on decode (histories from before the key was set)', async () => {
    const codec = codecWith(newKey());
    const [p] = await codec.decode([toPayload({ old: true })]);
    expect(defaultPayloadConverter.fromPayload(p)).toEqual({ old: true });
  });

  it('detects tampering: any flipped byte (IV, ciphertext or tag) or a swapped key id fails with a clear error', async () => {
    const codec = codecWith(newKey(), 'k1', `k2:${newKey()}`);
    const [enc] = await codec.encode([toPayload({ amount: 100 })]);
    const data = Buffer.from(enc.data!);
    for (const at of [0, 11, 12, Math.floor(data.length / 2), data.length - 1]) {
      const flipped = Buffer.from(data);
      flipped[at] ^= 0x01;
      await expect(codec.decode([{ ...enc, data: flipped }])).rejects.toThrow(/failed authentication with key "k1": it was altered/);
    }
    await expect(codec.decode([{ ...enc, data: data.subarray(0, 20) }])).rejects.toThrow(/truncated/);
    // The key id is authenticated: relabelling the payload with another configured key fails too.
    const relabelled = { ...enc, metadata: { ...enc.metadata, [METADATA_KEY_ID]: Buffer.from('k2') } };
    await expect(codec.decode([relabelled])).rejects.toThrow(/failed authentication with key "k2"/);
    const unknown = { ...enc, metadata: { ...enc.metadata, [METADATA_KEY_ID]: Buffer.from('nope') } };
    await expect(codec.decode([unknown])).rejects.toThrow(/encrypted with key "nope", which is not configured .*SLIPWAY_PAYLOAD_KEYS/);
    const noId = { ...enc, metadata: { encoding: enc.metadata!.encoding } };
    await expect(codec.decode([noId])).rejects.toThrow(/without "encryption-key-id"/);
  });

  it('rotates: encodes with the current key, decodes payloads of old keys listed in SLIPWAY_PAYLOAD_KEYS', async () => {
    const oldKey = newKey();
    const older = newKey();
    const before = codecWith(oldKey, 'v1');
    const derivedOld = codecWith(older); // no id given: derived from the key
    const [fromV1] = await before.encode([toPayload('written under v1')]);
    const [fromDerived] = await derivedOld.encode([toPayload('written under a derived id')]);
    expect(text(fromDerived.metadata?.[METADATA_KEY_ID])).toBe(deriveKeyId(Buffer.from(older, 'base64')));

    const after = codecWith(newKey(), 'v2', `v1:${oldKey}, ${older}`);
    expect(after.currentKeyId).toBe('v2');
    const [fresh] = await after.encode([toPayload('written under v2')]);
    expect(text(fresh.metadata?.[METADATA_KEY_ID])).toBe('v2');
    const decoded = await after.decode([fromV1, fromDerived, fresh]);
    expect(decoded.map((p) => defaultPayloadConverter.fromPayload(p))).toEqual(['written under v1', 'written under a derived id', 'written under v2']);
    // The old codec cannot read the new key's payloads.
    await expect(before.decode([fresh])).rejects.toThrow(/key "v2", which is not configured/);
  });
});

describe('payload key configuration', () => {
  const home = () => {
    const dir = tempDir('slipway-payload-home-');
    return { dir, env: { SLIPWAY_HOME: dir } as NodeJS.ProcessEnv };
  };

  it('no key: Temporal default data converter, nothing changes', () => {
    const { env } = home();
    expect(payloadKeyringFromEnv(env)).toBeUndefined();
    expect(slipwayDataConverter(env)).toEqual({});
  });

  it('a key from the environment, or from $SLIPWAY_HOME/.env (the environment wins); its values join the redaction set', () => {
    const { dir, env } = home();
    const fileKey = newKey();
    const envKey = newKey();
    const oldKey = newKey();
    writeFileSync(path.join(dir, '.env'), `# history encryption\nSLIPWAY_PAYLOAD_KEY="${fileKey}"\nSLIPWAY_PAYLOAD_KEY_ID=from-file\nSLIPWAY_PAYLOAD_KEYS=old:${oldKey}\n`);
    const fromFile = payloadKeyringFromEnv(env)!;
    expect(fromFile.currentKeyId).toBe('from-file');
    expect(fromFile.keys.get('from-file')!.toString('base64')).toBe(fileKey);
    expect(fromFile.keys.get('old')!.toString('base64')).toBe(oldKey);
    expect(slipwayDataConverter(env).payloadCodecs).toHaveLength(1);
    expect(redact(`leaked ${fileKey} and ${oldKey}`, secretValuesWith({}, {}))).toBe('leaked [redacted] and [redacted]');

    const fromEnv = payloadKeyringFromEnv({ ...env, SLIPWAY_PAYLOAD_KEY: envKey, SLIPWAY_PAYLOAD_KEY_ID: 'from-env' })!;
    expect(fromEnv.currentKeyId).toBe('from-env');
    expect(fromEnv.keys.get('from-env')!.toString('base64')).toBe(envKey);
    expect(fromEnv.keys.has('old')).toBe(true); // SLIPWAY_PAYLOAD_KEYS still from the file
  });

  it('a malformed setting is an error naming the variable (and file), never the value', () => {
    const { dir, env } = home();
    const short = randomBytes(31).toString('base64');
    const cases: Array<[NodeJS.ProcessEnv, RegExp]> = [
      [{ SLIPWAY_PAYLOAD_KEY: short }, /^SLIPWAY_PAYLOAD_KEY: decodes to 31 bytes, expected 32/],
      [{ SLIPWAY_PAYLOAD_KEY: 'not base64 at all!!' }, /^SLIPWAY_PAYLOAD_KEY: not base64/],
      [{ SLIPWAY_PAYLOAD_KEY: newKey(), SLIPWAY_PAYLOAD_KEY_ID: 'has space' }, /^SLIPWAY_PAYLOAD_KEY_ID: key id must be/],
      [{ SLIPWAY_PAYLOAD_KEY: newKey(), SLIPWAY_PAYLOAD_KEYS: `a:${newKey()},b:${short}` }, /^SLIPWAY_PAYLOAD_KEYS: entry 2: decodes to 31 bytes/],
      [{ SLIPWAY_PAYLOAD_KEY: newKey(), SLIPWAY_PAYLOAD_KEY_ID: 'a', SLIPWAY_PAYLOAD_KEYS: `a:${newKey()}` }, /^SLIPWAY_PAYLOAD_KEYS: entry 1: key id "a" is already used by a different key/],
      [{ SLIPWAY_PAYLOAD_KEYS: `a:${newKey()}` }, /^SLIPWAY_PAYLOAD_KEYS is set but SLIPWAY_PAYLOAD_KEY is not/],
    ];
    for (const [vars, message] of cases) {
      let error: unknown;
      try {
        payloadKeyringFromEnv({ ...env, ...vars });
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(PayloadKeyError);
      expect((error as Error).message).toMatch(message);
      for (const value of Object.values(vars)) {
        for (const part of String(value).split(/[,:]/)) if (part.length >= 16) expect((error as Error).message).not.toContain(part);
      }
    }
    writeFileSync(path.join(dir, '.env'), `SLIPWAY_PAYLOAD_KEY=${short}\n`);
    expect(() => payloadKeyringFromEnv(env)).toThrow(`SLIPWAY_PAYLOAD_KEY (in ${path.join(dir, '.env')}): decodes to 31 bytes`);
    writeFileSync(path.join(dir, '.env'), `SLIPWAY_PAYLOAD_KEY=${newKey()}\nthis line ${short}\n`);
    expect(() => payloadKeyringFromEnv(env)).toThrow(`${path.join(dir, '.env')}:2: expected NAME=value`);
  });

  it('the key variables never reach child processes (agents, gates, sandbox commands)', async () => {
    expect(PAYLOAD_KEY_VARIABLES).toEqual(['SLIPWAY_PAYLOAD_KEY', 'SLIPWAY_PAYLOAD_KEY_ID', 'SLIPWAY_PAYLOAD_KEYS']);
    const given = { PATH: process.env.PATH, SLIPWAY_PAYLOAD_KEY: newKey(), SLIPWAY_PAYLOAD_KEY_ID: 'v1', SLIPWAY_PAYLOAD_KEYS: `v0:${newKey()}`, SLIPWAY_STREAM: 'api' };
    expect(Object.keys(childEnv('/', given)).sort()).toEqual(['PATH', 'PWD', 'SLIPWAY_STREAM']);
    // Every agent, gate and sandbox command is spawned through runProcess.
    const run = await runProcess({ command: process.execPath, args: ['-e', 'process.stdout.write(JSON.stringify(process.env))'], cwd: '/', env: given });
    const seen = JSON.parse(run.stdout) as Record<string, string>;
    expect(seen.SLIPWAY_STREAM).toBe('api');
    expect(Object.keys(seen).filter((k) => k.startsWith('SLIPWAY_PAYLOAD'))).toEqual([]);
    // Nor host git (lib/git.ts gitEnv: every git Slipway runs gets that environment), when the worker has them.
    const inGit = await withEnv({ SLIPWAY_PAYLOAD_KEY: given.SLIPWAY_PAYLOAD_KEY, SLIPWAY_PAYLOAD_KEY_ID: 'v1', SLIPWAY_PAYLOAD_KEYS: given.SLIPWAY_PAYLOAD_KEYS }, () => gitEnv());
    expect(Object.keys(inGit).filter((k) => k.startsWith('SLIPWAY_PAYLOAD'))).toEqual([]);
  });

  it('the CLI exits 2 on a malformed key, naming the variable, and starts nothing', async () => {
    const { dir } = home();
    const port = await testPort();
    const bad = randomBytes(16).toString('base64');
    const run = await slipway(['dev'], { SLIPWAY_HOME: dir, SLIPWAY_TEMPORAL_PORT: String(port), SLIPWAY_UI_PORT: String(await testPort()), SLIPWAY_PAYLOAD_KEY: bad });
    expect(run.code).toBe(2);
    expect(run.stderr).toContain('slipway: SLIPWAY_PAYLOAD_KEY: decodes to 16 bytes, expected 32');
    expect(run.stderr + run.stdout).not.toContain(bad);
    expect(run.stderr).not.toMatch(/\n\s+at /); // a message, not a stack
    expect(readdirSync(dir)).toEqual([]); // no server data, no log
    expect(await isPortOpen(port)).toBe(false);
    const worker = await slipway(['worker'], { SLIPWAY_HOME: dir, SLIPWAY_TEMPORAL_PORT: String(port), SLIPWAY_PAYLOAD_KEY: bad });
    expect(worker.code).toBe(2);
    expect(worker.stderr).toContain('SLIPWAY_PAYLOAD_KEY');
  });
});

describe('codec server', () => {
  it('decodes for the Web UI origin (CORS preflight with credentials), refuses other origins', async () => {
    const codec = codecWith(newKey(), 'ui');
    const ui = 'http://localhost:8233';
    const server = await startCodecServer({ codec, port: 0, allowedOrigins: [ui] });
    try {
      const [enc] = await codec.encode([toPayload({ hello: 'web ui' })]);
      const body = JSON.stringify({
        payloads: [{ metadata: Object.fromEntries(Object.entries(enc.metadata!).map(([k, v]) => [k, Buffer.from(v).toString('base64')])), data: Buffer.from(enc.data!).toString('base64') }],
      });
      const preflight = await fetch(`${server.url}/decode`, {
        method: 'OPTIONS',
        headers: { origin: ui, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,x-namespace' },
      });
      expect(preflight.status).toBe(204);
      expect(preflight.headers.get('access-control-allow-origin')).toBe(ui);
      expect(preflight.headers.get('access-control-allow-credentials')).toBe('true');
      expect(preflight.headers.get('access-control-allow-headers')).toContain('x-namespace');

      const res = await fetch(`${server.url}/decode`, { method: 'POST', headers: { origin: ui, 'content-type': 'application/json', 'x-namespace': 'default' }, body });
      expect(res.status).toBe(200);
      const out = (await res.json()) as { payloads: Array<{ metadata: Record<string, string>; data: string }> };
      expect(Buffer.from(out.payloads[0].metadata.encoding, 'base64').toString()).toBe('json/plain');
      expect(JSON.parse(Buffer.from(out.payloads[0].data, 'base64').toString())).toEqual({ hello: 'web ui' });

      // The Temporal CLI sends no Origin; /encode is the inverse.
      const encoded = await fetch(`${server.url}/encode`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(out) });
      const again = (await encoded.json()) as { payloads: Array<{ metadata: Record<string, string> }> };
      expect(Buffer.from(again.payloads[0].metadata.encoding, 'base64').toString()).toBe(ENCODING_ENCRYPTED);

      const evil = await fetch(`${server.url}/decode`, { method: 'POST', headers: { origin: 'https://evil.example', 'content-type': 'application/json' }, body });
      expect(evil.status).toBe(403);
      expect(evil.headers.get('access-control-allow-origin')).toBeNull();
      const garbage = await fetch(`${server.url}/decode`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"nope": 1}' });
      expect(garbage.status).toBe(400);
    } finally {
      await server.close();
    }
  });
});

describe('on a real Temporal server', () => {
  const KEY = newKey();
  let saved: Record<string, string | undefined>;
  let worker: TestWorker;
  let home: string;

  beforeAll(async () => {
    home = tempDir('slipway-payload-int-');
    saved = { SLIPWAY_PAYLOAD_KEY: process.env.SLIPWAY_PAYLOAD_KEY, SLIPWAY_PAYLOAD_KEY_ID: process.env.SLIPWAY_PAYLOAD_KEY_ID, SLIPWAY_HOME: process.env.SLIPWAY_HOME };
    // This test file's process only (pool: forks): the workers and Slipway's clients read the key from here.
    process.env.SLIPWAY_HOME = home;
    process.env.SLIPWAY_PAYLOAD_KEY = KEY;
    process.env.SLIPWAY_PAYLOAD_KEY_ID = 'it-key';
    worker = await startTestWorker();
  });
  afterAll(async () => {
    await worker?.stop();
    for (const [k, v] of Object.entries(saved ?? {})) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });

  /** Every byte of a workflow's history as the server stores it, fetched by a client with no codec. */
  async function rawHistoryBytes(raw: Client, workflowId: string): Promise<Buffer> {
    const history = await raw.workflow.getHandle(workflowId).fetchHistory();
    return Buffer.from(temporal.api.history.v1.History.encode(history).finish());
  }

  it('a secret-looking input and result never appear in the raw history; Slipway reads them back', async () => {
    // The janitor's input (the registry path) and its result (the repositories swept) carry the secret.
    const secret = `sk-live-${randomBytes(12).toString('hex')}`;
    const registryDir = path.join(home, secret);
    mkdirSync(registryDir);
    const registry = path.join(registryDir, 'repositories.json');
    const repository = path.join(registryDir, 'gone-repo');
    writeFileSync(registry, JSON.stringify({ version: 1, repositories: { [repository]: {} } }));

    const { client, close } = await connectClient({ address: inject('temporalAddress'), namespace: 'default' });
    const rawConnection = await Connection.connect({ address: inject('temporalAddress') });
    const raw = new Client({ connection: rawConnection }); // no codec
    try {
      const workflowId = `payload-codec-${randomUUID()}`;
      const report = await client.workflow.execute(janitorWorkflow, { taskQueue: worker.taskQueue, workflowId, args: [{ registry }] });
      expect(report.repositories.map((r) => r.repository)).toEqual([repository]); // Slipway's client decrypts
      expect(report.repositories[0].missing).toBe(true);

      const bytes = await rawHistoryBytes(raw, workflowId);
      expect(bytes.includes(Buffer.from(secret))).toBe(false);
      expect(bytes.includes(Buffer.from('gone-repo'))).toBe(false);
      expect(bytes.includes(Buffer.from(ENCODING_ENCRYPTED))).toBe(true);
      expect(bytes.includes(Buffer.from('it-key'))).toBe(true);
      // The raw client sees only ciphertext where the result is.
      await expect(raw.workflow.getHandle(workflowId).result()).rejects.toThrow(/binary\/encrypted/);
      // Slipway's client decrypts the whole history too.
      const decoded = await client.workflow.getHandle(workflowId).fetchHistory();
      expect(decoded.events?.length).toBeGreaterThan(0);

      // Control: the same check does see plaintext when the starter has no codec (the input stays plain).
      const controlId = `payload-codec-control-${randomUUID()}`;
      await raw.workflow.start(janitorWorkflow, { taskQueue: worker.taskQueue, workflowId: controlId, args: [{ registry, repositories: [] }] });
      await client.workflow.getHandle(controlId).result(); // the worker decodes plain input and encrypts its own output
      expect((await rawHistoryBytes(raw, controlId)).includes(Buffer.from(secret))).toBe(true);
    } finally {
      await close();
      await rawConnection.close();
    }
    expect(existsSync(registry)).toBe(true);
  });
});
