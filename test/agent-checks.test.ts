/**
 * `slipway run` checks each real agent on the machine it runs on before anything starts: the
 * executable exists, the chosen provider has credentials (presence of names or login files only),
 * the permission mode is one the provider knows. Each refusal is exit 2 with a message naming the
 * provider, the field and what to set, and nothing is started (the embedded mode would create its
 * SQLite file first). A key that passes the check shows by the next check refusing instead
 * (the objective id, made to be in use).
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { checkAgentsOnThisMachine } from '../activities/agents/preflight';
import { codexCredentialSources } from '../agents/codex';
import { AgentSchema } from '../core/objective-schema';
import { testPort } from './helpers/ports';
import { slipway } from './helpers/cli';
import { writeObjective } from './helpers/objective';
import { makeTinyRepo, tempDir } from './helpers/repo';

/** Every credential variable any provider reads, blanked: the test machine's own must not decide. */
const NO_KEYS = Object.fromEntries(
  [
    'ANTHROPIC_API_KEY', 'ANTHROPIC_AUTH_TOKEN', 'ANTHROPIC_OAUTH_TOKEN', 'CLAUDE_CODE_OAUTH_TOKEN', 'CLAUDE_CODE_USE_BEDROCK', 'CLAUDE_CODE_USE_VERTEX', 'CLAUDE_CONFIG_DIR',
    'OPENAI_API_KEY', 'CODEX_API_KEY', 'CODEX_HOME', 'GEMINI_API_KEY', 'GOOGLE_GENERATIVE_AI_API_KEY', 'OPENROUTER_API_KEY', 'GROQ_API_KEY', 'XAI_API_KEY',
    'MISTRAL_API_KEY', 'DEEPSEEK_API_KEY', 'PI_CODING_AGENT_DIR', 'OPENCODE_CONFIG', 'XDG_CONFIG_HOME', 'XDG_DATA_HOME',
  ].map((name) => [name, '']),
);

async function run(objective: Record<string, unknown>, env: Record<string, string> = {}, id = 'agent-check') {
  const file = writeObjective({ objective: 'x', streams: [{ id: 'a', task: 'do a' }], ...objective });
  const home = tempDir('slipway-home-');
  const result = await slipway(['run', file, '--id', id], { ...NO_KEYS, HOME: tempDir('slipway-agent-home-'), SLIPWAY_HOME: home, SLIPWAY_TEMPORAL_PORT: String(await testPort()), ...env });
  expect(existsSync(path.join(home, 'temporal.sqlite')), 'nothing was started').toBe(false);
  return result;
}

/** A repository whose objective id `id` is taken, so a run that passes the agent checks still stops, at the next check. */
function repoWithIdInUse(id: string): string {
  const repo = makeTinyRepo();
  execFileSync('git', ['branch', `slipway/${id}/a`], { cwd: repo });
  return repo;
}

const CASES = [
  { provider: 'claude-code', key: 'ANTHROPIC_API_KEY', hint: /Set ANTHROPIC_API_KEY/ },
  { provider: 'codex', key: 'OPENAI_API_KEY', hint: /Set OPENAI_API_KEY/ },
  { provider: 'pi', key: 'ANTHROPIC_API_KEY', model: 'anthropic/claude-sonnet-4-5', hint: /none of ANTHROPIC_API_KEY, ANTHROPIC_OAUTH_TOKEN is set/ },
  { provider: 'opencode', key: 'OPENAI_API_KEY', model: 'openai/gpt-5', hint: /OPENAI_API_KEY is not set/ },
  { provider: 'copilot', key: 'GH_TOKEN', hint: /none of COPILOT_GITHUB_TOKEN, GH_TOKEN, GITHUB_TOKEN is set/ },
] as const;

describe('slipway run: the agents are checked on this machine before anything starts', () => {
  for (const c of CASES) {
    it(`${c.provider} without credentials: exit 2 naming the provider, the variable to set and "on this machine"; with ${c.key} in .slipway/.env it passes`, async () => {
      const id = `creds-${c.provider}`;
      const repo = repoWithIdInUse(id);
      const agent = { provider: c.provider, command: process.execPath, ...('model' in c ? { model: c.model } : {}) };
      const secret = `sk-must-not-print-${c.provider}`;
      // A key of ANOTHER provider is set: it does not count, and its value is never printed.
      const other = c.key === 'ANTHROPIC_API_KEY' ? 'OPENAI_API_KEY' : 'ANTHROPIC_API_KEY';
      const missing = await run({ repository: repo, agents: { builder: agent } }, { [other]: secret }, id);
      expect(missing.code).toBe(2);
      expect(missing.stderr).toContain(`agents.builder.provider: the builder agent (${c.provider}) has no credentials on this machine`);
      expect(missing.stderr).toMatch(c.hint);
      expect(missing.stderr).toContain(path.join(repo, '.slipway', '.env'));
      expect(missing.stderr).toContain('--no-agent-checks');
      expect(missing.stderr).not.toContain(secret);

      mkdirSync(path.join(repo, '.slipway'), { recursive: true });
      writeFileSync(path.join(repo, '.slipway', '.env'), `${c.key}=${secret}\n`);
      const present = await run({ repository: repo, agents: { builder: agent } }, {}, id);
      expect(present.code).toBe(2);
      expect(present.stderr).not.toContain('agents.builder');
      expect(present.stderr).toContain(`objective id "${id}" was used before`);
      expect(present.stderr).not.toContain(secret);
    }, 120_000);
  }

  it('a login file counts as credentials (Claude Code\'s .credentials.json under CLAUDE_CONFIG_DIR)', async () => {
    const id = 'creds-login';
    const repo = repoWithIdInUse(id);
    const config = tempDir('slipway-claude-config-');
    const agents = { builder: { provider: 'claude-code', command: process.execPath } };
    const before = await run({ repository: repo, agents }, { CLAUDE_CONFIG_DIR: config }, id);
    expect(before.stderr).toContain(`${path.join(config, '.credentials.json')} does not exist`);
    writeFileSync(path.join(config, '.credentials.json'), '{}');
    const after = await run({ repository: repo, agents }, { CLAUDE_CONFIG_DIR: config }, id);
    expect(after.stderr).toContain(`objective id "${id}" was used before`);
  }, 120_000);

  it('an executable that is not there: exit 2 naming agents.<role>.command, for a path and for a name not on PATH', async () => {
    const repo = makeTinyRepo();
    const keys = { ANTHROPIC_API_KEY: 'sk-x', OPENAI_API_KEY: 'sk-y' };
    const byPath = await run({ repository: repo, agents: { builder: { provider: 'claude-code', command: '/nonexistent/claude' } } }, keys);
    expect(byPath.code).toBe(2);
    expect(byPath.stderr).toContain('agents.builder.command: the builder agent (claude-code): "/nonexistent/claude" does not exist or is not executable on this machine');
    const onPath = await run({ repository: repo, agents: { builder: { provider: 'claude-code', command: process.execPath }, reviewer: { provider: 'codex' } } }, { ...keys, PATH: path.dirname(process.execPath) });
    expect(onPath.code).toBe(2);
    expect(onPath.stderr).toContain('agents.reviewer.command: the reviewer agent (codex): "codex" is not on PATH on this machine; install it there (and on the worker), or set agents.reviewer.command');
    expect(onPath.stderr).not.toContain('agents.builder');
  }, 120_000);

  for (const [provider, mode] of [['claude-code', 'yolo'], ['codex', 'acceptAll'], ['pi', 'acceptEdits'], ['opencode', 'dontAsk'], ['copilot', 'acceptEdits']] as const) {
    it(`${provider}: an unknown permission_mode is exit 2 naming the provider and its modes`, async () => {
      const r = await run({ repository: makeTinyRepo(), agents: { builder: { provider, command: process.execPath, permission_mode: mode } } });
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(new RegExp(`objective\\.yaml:\\d+:\\d+: agents\\.builder\\.permission_mode: ${provider} does not know permission_mode "${mode}" \\(use one of: `));
    }, 120_000);
  }
});

describe('credential sources per provider (table)', () => {
  const read = (files: Record<string, string>) => (file: string) => files[file];
  it('codex: the default provider wants OPENAI_API_KEY, CODEX_API_KEY or auth.json; a custom provider its env_key; a local one nothing', () => {
    expect(codexCredentialSources({ CODEX_HOME: '/c' }, '/h', read({}))).toEqual({ env: ['OPENAI_API_KEY', 'CODEX_API_KEY'], files: ['/c/auth.json'] });
    expect(codexCredentialSources({}, '/h', read({}))).toEqual({ env: ['OPENAI_API_KEY', 'CODEX_API_KEY'], files: ['/h/.codex/auth.json'] });
    const custom = 'model_provider = "fake"\n[model_providers.fake]\nbase_url = "http://x"\nenv_key = "FAKE_KEY"\n';
    expect(codexCredentialSources({ CODEX_HOME: '/c' }, '/h', read({ '/c/config.toml': custom }))).toEqual({ env: ['FAKE_KEY'], files: [] });
    expect(codexCredentialSources({ CODEX_HOME: '/c' }, '/h', read({ '/c/config.toml': 'model_provider = "ollama"\n' }))).toMatchObject({ keyless: true });
    expect(codexCredentialSources({ CODEX_HOME: '/c' }, '/h', read({ '/c/config.toml': 'model_provider = "x"\n[model_providers.x]\nbase_url = "http://x"\n' }))).toMatchObject({ keyless: true });
    // A config codex cannot parse: the default sources (codex names the syntax error itself).
    expect(codexCredentialSources({ CODEX_HOME: '/c' }, '/h', read({ '/c/config.toml': 'model_provider = \n' }))).toMatchObject({ env: ['OPENAI_API_KEY', 'CODEX_API_KEY'] });
  });

  it('checkAgentsOnThisMachine: env, .slipway/.env and files each satisfy it; script agents are not checked', async () => {
    const repo = makeTinyRepo();
    const home = tempDir('slipway-agent-home-');
    const spec = (o: Record<string, unknown>) => AgentSchema.parse({ command: process.execPath, ...o });
    const check = (agents: Record<string, unknown>, env: NodeJS.ProcessEnv) => checkAgentsOnThisMachine({ repository: repo, agents: agents as never }, { ...NO_KEYS, HOME: home, PATH: process.env.PATH, ...env });
    expect(await check({ builder: spec({ provider: 'script', command: 'whatever-is-not-there' }) }, {})).toEqual([]);
    expect(await check({ builder: spec({ provider: 'claude-code' }) }, { ANTHROPIC_AUTH_TOKEN: 't' })).toEqual([]);
    expect(await check({ builder: spec({ provider: 'pi', model: 'google/gemini-2.5-pro' }) }, { GEMINI_API_KEY: 'k' })).toEqual([]);
    expect(await check({ builder: spec({ provider: 'pi', model: 'google/gemini-2.5-pro' }) }, { OPENAI_API_KEY: 'k' })).toHaveLength(1);
    mkdirSync(path.join(home, '.pi', 'agent'), { recursive: true });
    writeFileSync(path.join(home, '.pi', 'agent', 'models.json'), '{}');
    expect(await check({ builder: spec({ provider: 'pi', model: 'fake/m' }) }, {})).toEqual([]);
    expect(await check({ builder: spec({ provider: 'opencode' }) }, {})).toHaveLength(1);
    mkdirSync(path.join(home, '.local', 'share', 'opencode'), { recursive: true });
    writeFileSync(path.join(home, '.local', 'share', 'opencode', 'auth.json'), '{}');
    expect(await check({ builder: spec({ provider: 'opencode' }) }, {})).toEqual([]);
  });
});
