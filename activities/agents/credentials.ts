/**
 * Credentials for agent processes: the worker's own environment (inherited by every sandbox
 * command) plus `<repository>/.slipway/.env`, read here, inside the agent activity, on every run.
 * The file's values go only into the agent process's environment (and its prompt's `` !`command` ``
 * expansions, which run in the same sandbox for it). They never enter workflow input, history,
 * logs or the ledger: error messages name the file and line, never a value, and everything the
 * activity returns is redacted with them (activities/redact.ts).
 *
 * Syntax (the common dotenv subset): `KEY=value`, optional `export `, `#` comments, blank lines,
 * 'single quoted' (literal), "double quoted" (\n \t \" \\ escapes, may span lines), and unquoted
 * values with a trailing ` # comment` removed.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SLIPWAY_DIR } from '../../core/ids';

export const PROJECT_ENV_FILE = path.join(SLIPWAY_DIR, '.env');

export class ProjectEnvError extends Error {}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function parseDotenv(text: string, file: string): Record<string, string> {
  const env: Record<string, string> = {};
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const lineNo = i + 1;
    const line = lines[i].trim();
    if (!line || line.startsWith('#')) continue;
    const body = line.startsWith('export ') ? line.slice(7).trimStart() : line;
    const eq = body.indexOf('=');
    const name = eq === -1 ? body : body.slice(0, eq).trim();
    if (eq === -1 || !NAME.test(name)) {
      // Never quote the line: it may hold a secret.
      throw new ProjectEnvError(`${file}:${lineNo}: expected NAME=value${NAME.test(name) ? '' : ' (NAME: letters, digits and "_")'}`);
    }
    let rest = body.slice(eq + 1).trimStart();
    let value: string;
    if (rest.startsWith("'")) {
      const end = rest.indexOf("'", 1);
      if (end === -1) throw new ProjectEnvError(`${file}:${lineNo}: ${name}: unterminated single quote`);
      value = rest.slice(1, end);
    } else if (rest.startsWith('"')) {
      // A double-quoted value may continue on the following lines.
      let raw = rest.slice(1);
      let end = closingQuote(raw);
      while (end === -1 && i + 1 < lines.length) {
        raw += `\n${lines[++i]}`;
        end = closingQuote(raw);
      }
      if (end === -1) throw new ProjectEnvError(`${file}:${lineNo}: ${name}: unterminated double quote`);
      value = raw.slice(0, end).replace(/\\([nrt"\\$])/g, (_, c: string) => ({ n: '\n', r: '\r', t: '\t' })[c as 'n'] ?? c);
    } else {
      const comment = rest.search(/\s#/);
      if (comment !== -1) rest = rest.slice(0, comment);
      value = rest.trim();
    }
    env[name] = value;
  }
  return env;
}

function closingQuote(raw: string): number {
  for (let j = 0; j < raw.length; j++) {
    if (raw[j] === '\\') j++;
    else if (raw[j] === '"') return j;
  }
  return -1;
}

/** `<repository>/.slipway/.env`, or nothing when the file does not exist. */
export async function readProjectEnv(repository: string): Promise<Record<string, string>> {
  const file = path.join(repository, PROJECT_ENV_FILE);
  let text: string;
  try {
    text = await fs.readFile(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw new ProjectEnvError(`cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? 'error'}`);
  }
  return parseDotenv(text, file);
}
