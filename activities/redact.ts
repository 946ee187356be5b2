/**
 * Removes secret values from text before it can reach workflow history, logs, the ledger or an
 * API response. Agents and gates may print their environment or `cat .env`; we never keep it.
 *
 * One redaction set, built from:
 * - the worker's environment: values of secret-looking names (`*KEY*`, `*TOKEN*`, ...; this
 *   includes `SLIPWAY_API_TOKEN`);
 * - the repository's `.slipway/.env` (credentials for agents);
 * - the repository's own `.env` and `.env.*` files at its root, which `copy_ignored` copies into
 *   every worktree, so gates and agents can print them;
 * - tokens minted at run time (API and grant tokens), handed in with `registerSecrets`.
 * `.env` files are parsed with dotenv. Their values count as secrets whatever the variable's name,
 * except plain settings (see PLAIN_SETTING), which would only garble output.
 *
 * `redact(text)` without an explicit set uses everything this process knows: the worker's
 * environment, registered tokens and every repository read so far. Callers that know the
 * repository (or the sandbox, which lives inside it) use `redactorFor`, which reads its files first.
 */
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { parse as parseDotenvText } from 'dotenv';
import { SLIPWAY_DIR, WORKTREES_DIR } from '../core/ids';

const SECRET_NAME = /(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE)/i;
const MIN_SECRET_LENGTH = 6;
/**
 * `.env` values that cannot be secrets, so redacting them would only garble output:
 * booleans, numbers, and plain lowercase words (`development`, `us-east-1`-like names keep digits out).
 */
const PLAIN_SETTING = /^(true|false|yes|no|on|off|\d+(\.\d+)?|[a-z]+(-[a-z]+)*)$/;
/** A `.env` file bigger than this is not a settings file; it is skipped rather than read whole. */
const MAX_ENV_FILE_BYTES = 1024 * 1024;
const REDACTED = '[redacted]';

export function secretValues(env: NodeJS.ProcessEnv = process.env): string[] {
  return Object.entries(env)
    .filter(([name, value]) => SECRET_NAME.test(name) && typeof value === 'string' && value.length >= MIN_SECRET_LENGTH)
    .map(([, value]) => value as string)
    .sort((a, b) => b.length - a.length);
}

/** The values of a `.env`-style file that are worth redacting (all but plain settings), and each long line of multi-line ones. */
export function envFileSecrets(vars: Record<string, string>): string[] {
  return (
    Object.entries(vars)
      .filter(([name, value]) => value.length >= MIN_SECRET_LENGTH && (SECRET_NAME.test(name) || !PLAIN_SETTING.test(value)))
      // A multi-line value (a private key) may reach the output one line at a time.
      .flatMap(([, value]) => [value, ...value.split('\n').filter((line) => line.trim().length >= 16)])
  );
}

/**
 * Secrets of the worker's environment plus those of a project `.env`: every value of a
 * secret-looking name, and every other value unless it is a plain setting (see PLAIN_SETTING).
 */
export function secretValuesWith(projectEnv: Record<string, string>, env: NodeJS.ProcessEnv = process.env): string[] {
  return sortLongestFirst([...secretValues(env), ...envFileSecrets(projectEnv), ...registered]);
}

export function redact(text: string, secrets: string[] = knownSecrets()): string {
  let out = text;
  for (const secret of secrets) {
    if (secret && out.includes(secret)) out = out.split(secret).join(REDACTED);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tokens minted at run time, and repositories read so far (the default set of `redact`).

const registered = new Set<string>();
const repositorySecretsCache = new Map<string, { stamp: string; secrets: string[] }>();

/** Adds values (API tokens, grant tokens) to the set every later `redact` uses in this process. */
export function registerSecrets(values: Iterable<string>): void {
  for (const v of values) if (typeof v === 'string' && v.length >= MIN_SECRET_LENGTH) registered.add(v);
}

/** Everything this process knows: the worker's environment, registered tokens, every repository read so far. */
export function knownSecrets(env: NodeJS.ProcessEnv = process.env): string[] {
  const fromRepositories = [...repositorySecretsCache.values()].flatMap((c) => c.secrets);
  return sortLongestFirst([...secretValues(env), ...registered, ...fromRepositories]);
}

// ---------------------------------------------------------------------------------------------
// A repository's files

/** `.env` files of a repository whose values are secrets: `.slipway/.env`, and `.env`, `.env.*` at the root. */
export async function repositoryEnvFiles(repository: string): Promise<string[]> {
  let names: string[];
  try {
    names = await fs.readdir(repository);
  } catch {
    names = [];
  }
  const rootFiles = names.filter((n) => n === '.env' || n.startsWith('.env.')).sort();
  return [path.join(repository, SLIPWAY_DIR, '.env'), ...rootFiles.map((n) => path.join(repository, n))];
}

/**
 * Reads a `.env`-style file for its values; nothing when it is missing, not a regular file (a FIFO
 * must not block the worker) or too big. Never throws: redaction must not fail the work it guards.
 */
async function readEnvFileValues(file: string): Promise<{ stamp: string; vars: Record<string, string> }> {
  let handle: fs.FileHandle | undefined;
  try {
    handle = await fs.open(file, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
    const stat = await handle.stat();
    if (!stat.isFile() || stat.size > MAX_ENV_FILE_BYTES) return { stamp: `${file}:skipped`, vars: {} };
    const text = await handle.readFile('utf8');
    return { stamp: `${file}:${stat.mtimeMs}:${stat.size}:${stat.ino}`, vars: parseDotenvText(text) };
  } catch {
    return { stamp: `${file}:none`, vars: {} };
  } finally {
    await handle?.close().catch(() => undefined);
  }
}

/**
 * The secrets of a repository's `.env` files (not the worker's environment). Re-read when a file
 * changes; remembered, so the default set of `redact` covers this repository from now on.
 */
export async function repositorySecrets(repository: string): Promise<string[]> {
  const files = await repositoryEnvFiles(repository);
  const read = await Promise.all(files.map(readEnvFileValues));
  const stamp = read.map((r) => r.stamp).join('|');
  const cached = repositorySecretsCache.get(repository);
  if (cached?.stamp === stamp) return cached.secrets;
  const secrets = [...new Set(read.flatMap((r) => envFileSecrets(r.vars)))];
  repositorySecretsCache.set(repository, { stamp, secrets });
  return secrets;
}

/**
 * The repository a local sandbox belongs to, from Slipway's own layout
 * (`<repository>/.slipway/worktrees/<group>/<name>`), never from git state inside the sandbox,
 * which the sandbox controls. Undefined for a path outside that layout.
 */
export function repositoryOfSandbox(sandboxPath: string): string | undefined {
  const resolved = path.resolve(sandboxPath);
  const marker = `${path.sep}${WORKTREES_DIR.split('/').join(path.sep)}${path.sep}`;
  const at = resolved.lastIndexOf(marker);
  return at > 0 ? resolved.slice(0, at) : undefined;
}

/** The full set for work in `repositoryOrSandbox`: the worker's environment, registered tokens, that repository's files, and every repository read before. */
export async function secretsFor(repositoryOrSandbox: string, env: NodeJS.ProcessEnv = process.env): Promise<string[]> {
  const repository = repositoryOfSandbox(repositoryOrSandbox) ?? repositoryOrSandbox;
  await repositorySecrets(repository);
  return knownSecrets(env);
}

/** `redact` bound to the full set for a repository or one of its sandboxes. */
export async function redactorFor(repositoryOrSandbox: string): Promise<(text: string) => string> {
  const secrets = await secretsFor(repositoryOrSandbox);
  return (text) => redact(text, secrets);
}

function sortLongestFirst(values: string[]): string[] {
  // Longest first: a secret containing another is replaced whole.
  return [...new Set(values)].sort((a, b) => b.length - a.length);
}
