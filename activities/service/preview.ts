/**
 * Preview ports (ADR 0015): where a preview lives and who may open it.
 *
 * Each open port of a sandbox has its own origin, `<id>-<port>.<preview domain>` (the sandbox
 * id without its `sbx_` prefix), so a page of one preview can neither read another's responses
 * nor the API's, and its cookies are its own. Access is an account token (Authorization:
 * Bearer) or a signed link: HMAC-SHA256 over sandbox, port and expiry with a key kept under
 * `$SLIPWAY_HOME` (0600, made once). The first request with `?slipway_preview=<link token>`
 * turns it into a host-only, HttpOnly cookie of that preview origin, valid until the link expires.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import path from 'node:path';
import { SANDBOX_ID_PATTERN } from '../../core/sandbox-service';
import { readOrCreateSecret } from '../../lib/secret-file';

export const PREVIEW_KEY_FILE = 'preview-link.key';
/** The query parameter of a signed link, and the cookie it becomes. */
export const PREVIEW_LINK_PARAM = 'slipway_preview';
export const PREVIEW_COOKIE = 'slipway_preview';
export const DEFAULT_PREVIEW_DOMAIN = 'localhost';
export const DEFAULT_LINK_TTL_SECONDS = 15 * 60;
export const MAX_LINK_TTL_SECONDS = 24 * 60 * 60;
/** Ports a preview may expose (privileged ports need privileges no sandbox has anyway). */
export const MIN_PREVIEW_PORT = 1;
export const MAX_PREVIEW_PORT = 65535;

/** The link key: read from `$SLIPWAY_HOME/preview-link.key`, made (32 random bytes, 0600) the first time. */
export function loadPreviewKey(dataDir: string): Promise<Buffer> {
  return readOrCreateSecret(path.join(dataDir, PREVIEW_KEY_FILE), () => randomBytes(32), (k) => (k.length < 32 ? 'the preview link key is shorter than 32 bytes' : undefined));
}

const mac = (key: Buffer, sandboxId: string, port: number, expires: number) =>
  createHmac('sha256', key).update(`slipway-preview:v1:${sandboxId}:${port}:${expires}`).digest('base64url');

/** A link token for one sandbox and port, valid until `expiresAtMs` (whole seconds). */
export function signPreviewLink(key: Buffer, t: { sandboxId: string; port: number; expiresAtMs: number }): string {
  const expires = Math.floor(t.expiresAtMs / 1000);
  return `${expires}.${mac(key, t.sandboxId, t.port, expires)}`;
}

export type LinkCheck = { ok: true; expiresAtMs: number } | { ok: false; reason: 'malformed' | 'expired' | 'bad_signature' };

export function verifyPreviewLink(key: Buffer, token: string, t: { sandboxId: string; port: number; nowMs: number }): LinkCheck {
  const m = /^(\d{1,12})\.([A-Za-z0-9_-]{43})$/.exec(token);
  if (!m) return { ok: false, reason: 'malformed' };
  const expires = Number(m[1]);
  const want = Buffer.from(mac(key, t.sandboxId, t.port, expires));
  const got = Buffer.from(m[2]!);
  // The signature is checked before the expiry, so a forged token never learns which it failed.
  if (got.length !== want.length || !timingSafeEqual(got, want)) return { ok: false, reason: 'bad_signature' };
  if (expires * 1000 <= t.nowMs) return { ok: false, reason: 'expired' };
  return { ok: true, expiresAtMs: expires * 1000 };
}

/** `<id without sbx_>-<port>.<domain>`: the preview's own origin. */
export function previewHost(sandboxId: string, port: number, domain: string): string {
  return `${sandboxId.replace(/^sbx_/, '')}-${port}.${domain}`;
}

/**
 * The sandbox and port a Host header names, or undefined when it is not a preview host of
 * `domain` (then the request is the API's).
 */
export function parsePreviewHost(hostHeader: string | undefined, domain: string): { sandboxId: string; port: number } | undefined {
  if (!hostHeader) return undefined;
  const host = hostHeader.toLowerCase().replace(/:\d+$/, '');
  const suffix = `.${domain.toLowerCase()}`;
  if (!host.endsWith(suffix)) return undefined;
  const m = /^([a-z2-7]{20})-(\d{1,5})$/.exec(host.slice(0, -suffix.length));
  if (!m) return undefined;
  const sandboxId = `sbx_${m[1]}`;
  const port = Number(m[2]);
  if (!SANDBOX_ID_PATTERN.test(sandboxId) || port < MIN_PREVIEW_PORT || port > MAX_PREVIEW_PORT || String(port) !== m[2]) return undefined;
  return { sandboxId, port };
}

/** The value of one cookie in a Cookie header. */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  for (const part of (header ?? '').split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/** The Cookie header without `name` (the app in the sandbox never sees the preview's credential). */
export function withoutCookie(header: string | undefined, name: string): string | undefined {
  const kept = (header ?? '')
    .split(';')
    .map((p) => p.trim())
    .filter((p) => p && p.slice(0, p.indexOf('=')).trim() !== name);
  return kept.length > 0 ? kept.join('; ') : undefined;
}
