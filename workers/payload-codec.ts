/**
 * Encrypted history payloads: a Temporal PayloadCodec with AES-256-GCM (node:crypto).
 *
 * Every payload a Slipway client or worker sends (workflow and activity inputs and results,
 * signals, updates, queries, memos) is serialized whole (its metadata too, so even the
 * `json/plain` encoding is hidden) and encrypted with the current key under a fresh random
 * 12-byte IV. The stored payload is `iv || ciphertext || tag` with metadata
 * `encoding: binary/encrypted` and `encryption-key-id: <id>`, so keys can rotate: encode with the
 * current key, decode with any configured one. The key id is bound to the ciphertext as
 * additional authenticated data. Payloads that are not encrypted (histories from before the key
 * was set) decode unchanged.
 *
 * Configuration (environment first, then `$SLIPWAY_HOME/.env`; never the repository's
 * `.slipway/.env`, whose values are handed to agent processes):
 *   SLIPWAY_PAYLOAD_KEY     base64 of 32 random bytes (`openssl rand -base64 32`): the current key
 *   SLIPWAY_PAYLOAD_KEY_ID  its id (default: derived from the key, `k-` + 12 hex digits)
 *   SLIPWAY_PAYLOAD_KEYS    older keys for decoding: `id:base64,id:base64` (or bare `base64`: id derived)
 * Unset: no codec, Temporal's default data converter (nothing changes). A malformed value is a
 * PayloadKeyError naming the variable (the CLI exits 2 before starting anything); messages never
 * contain a key.
 *
 * What stays readable to whoever reads the history: workflow and activity types, ids, task
 * queues, search attributes, timestamps, and failure messages and stack traces (Temporal's
 * default failure converter keeps them outside the encoded payloads; Slipway redacts known
 * secrets from them).
 */
import { createCipheriv, createDecipheriv, createHash, randomBytes } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
// Types only from the SDK: `slipway status`/`list` decode payloads over the HTTP API with this
// module and must not load the Temporal SDK (ADR 0024).
import type { DataConverter, Payload, PayloadCodec } from '@temporalio/common';
import { parseDotenv } from '../agents/credentials';
import { registerSecrets } from '../activities/redact';
import { PAYLOAD_KEY_ENV, PAYLOAD_KEY_ID_ENV, PAYLOAD_KEYS_ENV, PAYLOAD_KEY_VARIABLES } from '../lib/payload-keys';
import { slipwayHome } from '../lib/settings';

export const ENCODING_ENCRYPTED = 'binary/encrypted';
/** The SDK's METADATA_ENCODING_KEY. */
const METADATA_ENCODING_KEY = 'encoding';
export const METADATA_KEY_ID = 'encryption-key-id';
export const METADATA_CIPHER = 'encryption-cipher';
const CIPHER = 'AES-256-GCM';
const IV_BYTES = 12;
const TAG_BYTES = 16;
const KEY_BYTES = 32;

// The variables, never passed on to the processes Slipway starts, are named in lib/payload-keys.ts.
export { PAYLOAD_KEY_ENV, PAYLOAD_KEY_ID_ENV, PAYLOAD_KEYS_ENV, PAYLOAD_KEY_VARIABLES };

/** A malformed key setting; the message names the variable (and file), never the value. */
export class PayloadKeyError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PayloadKeyError';
  }
}

export interface PayloadKeyring {
  /** Id of the key new payloads are encrypted with. */
  currentKeyId: string;
  /** Every configured key by id (the current one included). */
  keys: Map<string, Buffer>;
}

// temporal.api.common.v1.Payload (fields 1 and 2), through protobufjs: the whole payload,
// metadata included, is what gets encrypted. Built on first use: loading protobufjs is most of
// this module's load time, which `status`/`list` pay even without a key (ADR 0024).
let payloadMessage: import('protobufjs').Type | undefined;
function PayloadMessage(): import('protobufjs').Type {
  if (!payloadMessage) {
    const protobuf = require('protobufjs') as typeof import('protobufjs');
    payloadMessage = new protobuf.Type('Payload').add(new protobuf.MapField('metadata', 1, 'string', 'bytes')).add(new protobuf.Field('data', 2, 'bytes'));
    new protobuf.Root().define('temporal.api.common.v1').add(payloadMessage);
  }
  return payloadMessage;
}

function serializePayload(payload: Payload): Uint8Array {
  const type = PayloadMessage();
  return type.encode(type.create({ metadata: payload.metadata ?? {}, data: payload.data ?? new Uint8Array(0) })).finish();
}

function deserializePayload(bytes: Uint8Array): Payload {
  const type = PayloadMessage();
  const m = type.toObject(type.decode(bytes), { bytes: Buffer }) as { metadata?: Record<string, Uint8Array>; data?: Uint8Array };
  return { metadata: m.metadata ?? {}, data: m.data ?? new Uint8Array(0) };
}

/** The SDK's ValueError (what its own converters throw on a payload they cannot decode), loaded only on that error. */
function valueError(message: string): Error {
  const { ValueError } = require('@temporalio/common') as typeof import('@temporalio/common');
  return new ValueError(message);
}

const utf8 = (s: string) => Buffer.from(s, 'utf8');
const text = (b: Uint8Array | null | undefined) => (b ? Buffer.from(b).toString('utf8') : undefined);
const aad = (keyId: string) => utf8(`slipway-payload-v1:${keyId}`);

export class EncryptionCodec implements PayloadCodec {
  private readonly current: Buffer;

  constructor(private readonly keyring: PayloadKeyring) {
    const current = keyring.keys.get(keyring.currentKeyId);
    if (!current) throw new PayloadKeyError(`the current payload key "${keyring.currentKeyId}" is not in the keyring`);
    for (const [id, key] of keyring.keys) {
      if (key.length !== KEY_BYTES) throw new PayloadKeyError(`payload key "${id}" has ${key.length} bytes, expected ${KEY_BYTES}`);
    }
    this.current = current;
  }

  get currentKeyId(): string {
    return this.keyring.currentKeyId;
  }

  async encode(payloads: Payload[]): Promise<Payload[]> {
    return payloads.map((payload) => this.encrypt(payload));
  }

  async decode(payloads: Payload[]): Promise<Payload[]> {
    return payloads.map((payload) => this.decrypt(payload));
  }

  private encrypt(payload: Payload): Payload {
    const keyId = this.keyring.currentKeyId;
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.current, iv, { authTagLength: TAG_BYTES });
    cipher.setAAD(aad(keyId));
    const body = Buffer.concat([cipher.update(serializePayload(payload)), cipher.final()]);
    return {
      metadata: {
        [METADATA_ENCODING_KEY]: utf8(ENCODING_ENCRYPTED),
        [METADATA_CIPHER]: utf8(CIPHER),
        [METADATA_KEY_ID]: utf8(keyId),
      },
      data: Buffer.concat([iv, body, cipher.getAuthTag()]),
    };
  }

  private decrypt(payload: Payload): Payload {
    if (text(payload.metadata?.[METADATA_ENCODING_KEY]) !== ENCODING_ENCRYPTED) return payload; // not ours: pass through
    const keyId = text(payload.metadata?.[METADATA_KEY_ID]);
    if (!keyId) throw valueError(`encrypted payload without "${METADATA_KEY_ID}" metadata: cannot pick a key`);
    const key = this.keyring.keys.get(keyId);
    if (!key) {
      throw valueError(
        `payload was encrypted with key "${keyId}", which is not configured (known: ${[...this.keyring.keys.keys()].join(', ')}); add it to ${PAYLOAD_KEYS_ENV} as ${keyId}:<base64>`,
      );
    }
    const data = payload.data ?? new Uint8Array(0);
    if (data.length < IV_BYTES + TAG_BYTES) throw valueError(`encrypted payload (key "${keyId}") is truncated: ${data.length} bytes`);
    const buf = Buffer.from(data);
    const decipher = createDecipheriv('aes-256-gcm', key, buf.subarray(0, IV_BYTES), { authTagLength: TAG_BYTES });
    decipher.setAAD(aad(keyId));
    decipher.setAuthTag(buf.subarray(buf.length - TAG_BYTES));
    let plain: Buffer;
    try {
      plain = Buffer.concat([decipher.update(buf.subarray(IV_BYTES, buf.length - TAG_BYTES)), decipher.final()]);
    } catch {
      throw valueError(`encrypted payload failed authentication with key "${keyId}": it was altered, or that id names a different key than the one it was written with`);
    }
    return deserializePayload(plain);
  }
}

// ---------------------------------------------------------------------------------------------
// Configuration

const KEY_ID = /^[A-Za-z0-9._-]{1,64}$/;
const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

/** `k-` and 12 hex digits of a hash of the key: a stable id that differs for every key. */
export function deriveKeyId(key: Buffer): string {
  return `k-${createHash('sha256').update('slipway-payload-key-id\0').update(key).digest('hex').slice(0, 12)}`;
}

function parseKey(value: string, where: string): Buffer {
  const v = value.trim();
  const key = BASE64.test(v) && v.length % 4 === 0 ? Buffer.from(v, 'base64') : undefined;
  if (!key) throw new PayloadKeyError(`${where}: not base64 (make one with \`openssl rand -base64 32\`)`);
  if (key.length !== KEY_BYTES) throw new PayloadKeyError(`${where}: decodes to ${key.length} bytes, expected ${KEY_BYTES} (make one with \`openssl rand -base64 32\`)`);
  return key;
}

function parseKeyId(value: string, where: string): string {
  const id = value.trim();
  if (!KEY_ID.test(id)) throw new PayloadKeyError(`${where}: key id must be 1-64 letters, digits, ".", "_" or "-"`);
  return id;
}

export interface PayloadKeySettings {
  key?: string;
  keyId?: string;
  keys?: string;
  /** Where each setting came from, for error messages: `SLIPWAY_PAYLOAD_KEY` or `SLIPWAY_PAYLOAD_KEY (in /x/.env)`. */
  sources?: Partial<Record<'key' | 'keyId' | 'keys', string>>;
}

/** The keyring from the three settings; undefined when no key is set. Throws PayloadKeyError. */
export function parsePayloadKeyring(s: PayloadKeySettings): PayloadKeyring | undefined {
  const name = (k: 'key' | 'keyId' | 'keys', fallback: string) => s.sources?.[k] ?? fallback;
  if (!s.key) {
    if (s.keys) throw new PayloadKeyError(`${name('keys', PAYLOAD_KEYS_ENV)} is set but ${PAYLOAD_KEY_ENV} is not: set the key to encrypt with`);
    if (s.keyId) throw new PayloadKeyError(`${name('keyId', PAYLOAD_KEY_ID_ENV)} is set but ${PAYLOAD_KEY_ENV} is not`);
    return undefined;
  }
  const current = parseKey(s.key, name('key', PAYLOAD_KEY_ENV));
  const currentKeyId = s.keyId ? parseKeyId(s.keyId, name('keyId', PAYLOAD_KEY_ID_ENV)) : deriveKeyId(current);
  const keys = new Map<string, Buffer>([[currentKeyId, current]]);
  const entries = (s.keys ?? '').split(',').map((e) => e.trim());
  entries.forEach((entry, i) => {
    if (!entry) return;
    const where = `${name('keys', PAYLOAD_KEYS_ENV)}: entry ${i + 1}`;
    const colon = entry.indexOf(':');
    const key = parseKey(colon === -1 ? entry : entry.slice(colon + 1), where);
    const id = colon === -1 ? deriveKeyId(key) : parseKeyId(entry.slice(0, colon), where);
    const known = keys.get(id);
    if (known && !known.equals(key)) throw new PayloadKeyError(`${where}: key id "${id}" is already used by a different key`);
    keys.set(id, key);
  });
  return { currentKeyId, keys };
}

/**
 * The key settings of this process: each variable from the environment when set there, else
 * from `$SLIPWAY_HOME/.env`. Every key value is added to the redaction set of this process.
 */
export function payloadKeyringFromEnv(env: NodeJS.ProcessEnv = process.env): PayloadKeyring | undefined {
  const file = path.join(slipwayHome(env), '.env');
  let fromFile: Record<string, string> = {};
  let isFile = false;
  try {
    isFile = statSync(file).isFile(); // never a FIFO or a device: they could block
  } catch {
    /* no file */
  }
  if (isFile) {
    let content: string;
    try {
      content = readFileSync(file, 'utf8');
    } catch (e) {
      throw new PayloadKeyError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? 'error'}`);
    }
    try {
      fromFile = parseDotenv(content, file);
    } catch (e) {
      throw new PayloadKeyError((e as Error).message); // names file and line, never a value
    }
  }
  const pick = (variable: string): [string | undefined, string] => {
    if (env[variable]) return [env[variable], variable];
    if (fromFile[variable]) return [fromFile[variable], `${variable} (in ${file})`];
    return [undefined, variable];
  };
  const [key, keySource] = pick(PAYLOAD_KEY_ENV);
  const [keyId, keyIdSource] = pick(PAYLOAD_KEY_ID_ENV);
  const [keys, keysSource] = pick(PAYLOAD_KEYS_ENV);
  const keyring = parsePayloadKeyring({ key, keyId, keys, sources: { key: keySource, keyId: keyIdSource, keys: keysSource } });
  if (keyring) {
    // The base64 forms, as they would appear in any output (an agent that prints its environment).
    const entries = [key!, ...(keys ?? '').split(',')].map((e) => e.trim()).filter(Boolean);
    registerSecrets(entries.flatMap((e) => [e, e.slice(e.indexOf(':') + 1)]));
  }
  return keyring;
}

/** Clients and workers of this process: encrypting when a key is configured, else Temporal's default. */
export function slipwayDataConverter(env: NodeJS.ProcessEnv = process.env): DataConverter {
  return dataConverterFor(payloadKeyringFromEnv(env));
}

/** The data converter for a keyring: with the encryption codec, or Temporal's default (`{}`) when there is no key. */
export function dataConverterFor(keyring: PayloadKeyring | undefined): DataConverter {
  return keyring ? { payloadCodecs: [new EncryptionCodec(keyring)] } : {};
}
