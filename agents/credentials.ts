/**
 * Credentials for agent processes: the worker's own environment (inherited by every sandbox
 * command) plus `<repository>/.slipway/.env`, read here, inside the agent activity, on every run.
 * The file's values go only into the agent process's environment (and its prompt's `` !`command` ``
 * expansions, which run in the same sandbox for it). They never enter workflow input, history,
 * logs or the ledger: error messages name the file and line, never a value, and everything the
 * activity returns is redacted with them (activities/redact.ts).
 *
 * Parsed with dotenv (`KEY=value`, optional `export `, `#` comments, 'single', "double" (with `\n`,
 * may span lines) and `backtick` quotes). dotenv skips lines it cannot read; we report them
 * instead (a typo would otherwise silently drop a credential), naming the line, never its content.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { parse as dotenvParse } from 'dotenv';
import { SLIPWAY_DIR } from '../core/ids';

export const PROJECT_ENV_FILE = path.join(SLIPWAY_DIR, '.env');

export class ProjectEnvError extends Error {}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const ASSIGNMENT = /^(?:export\s+)?([^=\s]*)\s*=\s*(.*)$/;
const QUOTES = ['"', "'", '`'];

/** Index of the first unescaped `quote` in `text`, or -1. */
function closingQuote(text: string, quote: string): number {
  for (let j = 0; j < text.length; j++) {
    if (text[j] === '\\') j++;
    else if (text[j] === quote) return j;
  }
  return -1;
}

export function parseDotenv(text: string, file: string): Record<string, string> {
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  let open: { quote: string; line: number; name: string } | undefined; // a quoted value spanning lines
  for (let i = 0; i < lines.length; i++) {
    const lineNo = i + 1;
    if (open) {
      if (closingQuote(lines[i], open.quote) !== -1) open = undefined;
      continue;
    }
    const line = lines[i].trim();
    if (!line || line.startsWith('#')) continue;
    const m = ASSIGNMENT.exec(line);
    if (!m || !NAME.test(m[1])) {
      // Never quote the line: it may hold a secret.
      throw new ProjectEnvError(`${file}:${lineNo}: expected NAME=value (NAME: letters, digits and "_")`);
    }
    const rest = m[2];
    if (QUOTES.includes(rest[0]) && closingQuote(rest.slice(1), rest[0]) === -1) open = { quote: rest[0], line: lineNo, name: m[1] };
  }
  if (open) throw new ProjectEnvError(`${file}:${open.line}: ${open.name}: unterminated ${open.quote === "'" ? 'single' : open.quote === '"' ? 'double' : 'backtick'} quote`);
  return dotenvParse(text);
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

/**
 * API key variables per model provider, as pi (pi-ai's env-api-keys) and OpenCode (models.dev)
 * read them, for the load-time credential check of agents whose `model` is `provider/model`.
 */
const MODEL_PROVIDER_KEYS: Record<string, string[]> = {
  anthropic: ['ANTHROPIC_API_KEY', 'ANTHROPIC_OAUTH_TOKEN'],
  openai: ['OPENAI_API_KEY'],
  google: ['GEMINI_API_KEY', 'GOOGLE_GENERATIVE_AI_API_KEY'],
  openrouter: ['OPENROUTER_API_KEY'],
  groq: ['GROQ_API_KEY'],
  xai: ['XAI_API_KEY'],
  mistral: ['MISTRAL_API_KEY'],
  deepseek: ['DEEPSEEK_API_KEY'],
};

/** The key variables for `model`'s provider prefix; every known one when the model names none or an unknown one (a custom provider declares its key in a config file). */
export function modelProviderKeys(model: string | undefined): string[] {
  const prefix = model?.includes('/') ? model.slice(0, model.indexOf('/')) : undefined;
  return (prefix && MODEL_PROVIDER_KEYS[prefix]) || [...new Set(Object.values(MODEL_PROVIDER_KEYS).flat())];
}
