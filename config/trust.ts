/**
 * Trust for a repository's own Slipway config. A cloned repository may carry `.slipway/config.yaml`
 * (agent `command`s, `extra_args`, permission modes, prompts with `` !`command` `` expansions and the
 * `prompt_file`s it names) and `.slipway/blueprints/` (which steps run: a blueprint can drop gates
 * or review). Those come from whoever wrote the repository, so Slipway uses them only after the
 * user ran `slipway trust <path>` (like `direnv allow`).
 *
 * A trust record is kept under `$SLIPWAY_HOME/trusted-repositories.json`, keyed by the
 * repository's real path, with a sha256 over the files' paths and bytes: any change to any of them
 * (or a new one) needs trust again. Objective files named on the command line need no trust (the
 * user chose them), nor do repositories without such files.
 */
import { slipwayHome } from '../lib/settings';
import { withFileLock } from '../lib/file-lock';
import { writeJsonAtomic } from '../lib/atomic-write';
import { createHash } from 'node:crypto';
import { constants, promises as fs } from 'node:fs';
import path from 'node:path';
import { quote } from 'shell-quote';
import { parse as parseYaml } from 'yaml';

export const TRUST_FILE = 'trusted-repositories.json';
const CONFIG_REL = path.join('.slipway', 'config.yaml');
const BLUEPRINTS_REL = path.join('.slipway', 'blueprints');

export interface ConfigFingerprint {
  /** The repository's real path (the record's key). */
  repository: string;
  /** Files that make up the repository's own config (absolute), in a stable order. Empty: nothing to trust. */
  files: string[];
  /** sha256 (hex) over each file's path (relative to the repository when inside it) and bytes. */
  hash: string;
}

export interface TrustRecord {
  hash: string;
  files: string[];
  trusted_at: string;
}

export type TrustStatus =
  | { state: 'no-config'; fingerprint: ConfigFingerprint }
  | { state: 'trusted'; fingerprint: ConfigFingerprint }
  | { state: 'untrusted'; fingerprint: ConfigFingerprint }
  | { state: 'changed'; fingerprint: ConfigFingerprint; record: TrustRecord };

export function trustFile(env: NodeJS.ProcessEnv = process.env): string {
  return path.join(slipwayHome(env), TRUST_FILE);
}

/** Bytes of a regular file (never a FIFO or device: they could block or never end); undefined when absent or not a file. */
async function readRegular(file: string): Promise<Buffer | undefined> {
  let handle: fs.FileHandle | undefined;
  try {
    handle = await fs.open(file, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
    const stat = await handle.stat();
    if (!stat.isFile()) return Buffer.from(`<not a regular file: ${stat.mode.toString(8)}>`);
    return await handle.readFile();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT' || (e as NodeJS.ErrnoException).code === 'ENOTDIR') return undefined;
    return Buffer.from(`<unreadable: ${(e as NodeJS.ErrnoException).code ?? 'error'}>`);
  } finally {
    await handle?.close().catch(() => undefined);
  }
}

/** Every entry below `dir` (files, and links or other non-directories as themselves), sorted. */
async function listTree(dir: string): Promise<string[]> {
  let entries;
  try {
    entries = await fs.readdir(dir, { withFileTypes: true });
  } catch {
    return [];
  }
  const out: string[] = [];
  for (const e of entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    const full = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...(await listTree(full)));
    else out.push(full);
  }
  return out;
}

/** The `prompt_file`s `.slipway/config.yaml` names (resolved against `.slipway/`), whatever else the file holds. */
function promptFilesOf(configText: string, configDir: string): string[] {
  let raw: unknown;
  try {
    raw = parseYaml(configText, { maxAliasCount: 100 });
  } catch {
    return []; // the loader reports the syntax error; the bytes are fingerprinted anyway
  }
  const agents = raw && typeof raw === 'object' ? (raw as Record<string, unknown>).agents : undefined;
  if (!agents || typeof agents !== 'object') return [];
  const files: string[] = [];
  for (const agent of Object.values(agents as Record<string, unknown>)) {
    const f = agent && typeof agent === 'object' ? (agent as Record<string, unknown>).prompt_file : undefined;
    if (typeof f === 'string' && f !== '') files.push(path.resolve(configDir, f));
  }
  return [...new Set(files)].sort();
}

/** What a repository's own config consists of right now, and its hash. */
export async function fingerprintRepositoryConfig(repository: string): Promise<ConfigFingerprint> {
  const root = await fs.realpath(repository).catch(() => path.resolve(repository));
  const configFile = path.join(root, CONFIG_REL);
  const config = await readRegular(configFile);
  const files: string[] = [];
  if (config !== undefined) files.push(configFile);
  files.push(...(await listTree(path.join(root, BLUEPRINTS_REL))));
  if (config !== undefined) files.push(...promptFilesOf(config.toString('utf8'), path.dirname(configFile)).filter((f) => !files.includes(f)));

  const hash = createHash('sha256');
  for (const file of files) {
    const rel = path.relative(root, file);
    const name = rel.startsWith('..') || path.isAbsolute(rel) ? file : rel;
    const bytes = (await readRegular(file)) ?? Buffer.from('<missing>');
    hash.update(`${name}\0${bytes.length}\0`);
    hash.update(bytes);
  }
  return { repository: root, files, hash: hash.digest('hex') };
}

async function readStore(file: string): Promise<Record<string, TrustRecord>> {
  try {
    const parsed = JSON.parse(await fs.readFile(file, 'utf8')) as { repositories?: Record<string, TrustRecord> };
    return parsed.repositories && typeof parsed.repositories === 'object' ? parsed.repositories : {};
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw new Error(`cannot read the trust records in ${file}: ${(e as Error).message}; run \`slipway trust\` for the repository again (it sets the file aside and starts a new one)`);
  }
}

/** Whether the repository's own config may be used as it is now. */
export async function checkRepositoryTrust(repository: string, env: NodeJS.ProcessEnv = process.env): Promise<TrustStatus> {
  const fingerprint = await fingerprintRepositoryConfig(repository);
  if (fingerprint.files.length === 0) return { state: 'no-config', fingerprint };
  const record = (await readStore(trustFile(env)))[fingerprint.repository];
  if (!record) return { state: 'untrusted', fingerprint };
  if (record.hash !== fingerprint.hash) return { state: 'changed', fingerprint, record };
  return { state: 'trusted', fingerprint };
}

/** Records the repository's own config, as it is now, as trusted. */
export async function trustRepository(repository: string, env: NodeJS.ProcessEnv = process.env): Promise<ConfigFingerprint> {
  const fingerprint = await fingerprintRepositoryConfig(repository);
  await updateStore(trustFile(env), (store) => {
    store[fingerprint.repository] = { hash: fingerprint.hash, files: fingerprint.files, trusted_at: new Date().toISOString() };
  });
  return fingerprint;
}

/** Forgets a repository's trust record; false when there was none. */
export async function untrustRepository(repository: string, env: NodeJS.ProcessEnv = process.env): Promise<boolean> {
  const root = await fs.realpath(repository).catch(() => path.resolve(repository));
  let removed = false;
  await updateStore(trustFile(env), (store) => {
    removed = Object.hasOwn(store, root);
    delete store[root];
  });
  return removed;
}

let inProcess: Promise<unknown> = Promise.resolve();

/**
 * Read-modify-write of the store under a lock (in this process, and across processes through
 * proper-lockfile), written to a unique temporary file and renamed over the store, so
 * concurrent `slipway trust` runs neither lose a record nor leave a torn file.
 */
async function updateStore(file: string, change: (store: Record<string, TrustRecord>) => void): Promise<void> {
  const run = inProcess.then(async () => {
    await fs.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    await withFileLock(file, async () => {
      const store = await readStore(file).catch(async () => {
        // A torn or hand-edited store: keep it for inspection, start a new one (trust is only ever re-granted here).
        await fs.rename(file, `${file}.corrupt-${Date.now()}`).catch(() => undefined);
        return {};
      });
      change(store);
      await writeJsonAtomic(file, { version: 1, repositories: store }, { mode: 0o600 });
    });
  });
  inProcess = run.catch(() => undefined);
  await run;
}

/** The problem `slipway run` reports for a repository whose own config is not trusted (undefined when it may be used). */
export function trustProblem(status: TrustStatus): { file: string; message: string } | undefined {
  if (status.state === 'no-config' || status.state === 'trusted') return undefined;
  const { repository, files } = status.fingerprint;
  const names = files.map((f) => path.relative(repository, f)).map((f) => (f.startsWith('..') ? '(outside) ' + f : f));
  const what =
    'this repository carries its own Slipway config, which can run commands (agent commands, prompt !`command` expansions) and change which steps run';
  const why = status.state === 'changed' ? 'it changed since it was trusted' : 'it is not trusted';
  return {
    file: files[0],
    message: `${what}; ${why} (${names.join(', ')}). Read it, then run: slipway trust ${quote([repository])}`,
  };
}
