/**
 * The real agent CLIs in the loop: Claude Code, Codex, Pi, OpenCode and Copilot, at the versions
 * scripts/setup.sh pins into `.tools/agents/`, each run by the real workflows as builder and
 * reviewer of an objective: write a file, fail the gate, fix it in the resumed session, pass
 * review, merge. Their model is the fake endpoint of test/helpers/fake-model.ts (Anthropic
 * Messages for Claude Code and Pi, OpenAI Responses for Codex, Chat Completions for OpenCode and Copilot), and
 * every CLI runs in a network namespace with only a loopback device (test/fixtures/agents/offline.mjs),
 * so nothing reaches the internet: no telemetry, no update check, no real model.
 *
 * Checks per CLI: the run's cwd and PWD are the sandbox, the files land on the stream branch and
 * merge, per-run usage and cost match what the endpoint served (also for the resumed run, where
 * the CLIs report session totals), the API key is never in workflow history or git, and no
 * process of the run is left.
 * A missing CLI fails the suite naming the setup step; it never skips.
 */
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, realpathSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadObjectiveFile } from '../config/objective-file';
import { integrationBranch, WORKTREES_DIR, objectiveWorkflowId, streamWorkflowId } from '../core/ids';
import type { AgentProviderKind } from '../core/objective-schema';
import type { ObjectiveResult } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';
import { startFakeModel, USAGE, type FakeModel } from './helpers/fake-model';
import { writeObjective } from './helpers/objective';
import { gitIn, makeDemoRepo, PROJECT_ROOT, tempDir } from './helpers/repo';
import { historyText, startTestWorker, type TestWorker } from './helpers/temporal';

type RealProvider = Exclude<AgentProviderKind, 'script'>;
const AGENT_BIN = path.join(PROJECT_ROOT, '.tools', 'agents', 'node_modules', '.bin');
const OFFLINE = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'offline.mjs');
const PORT = 4100; // inside each run's own network namespace: no clash between runs
const BASE = `http://127.0.0.1:${PORT}`;
/** Dollars per call of the fake endpoint at $3 / $15 per million input / output tokens (claude-sonnet-4-5's list price, and the price the Pi and OpenCode configs give). */
const COST_PER_CALL = (USAGE.input * 3 + USAGE.output * 15) / 1e6;

interface Cli {
  exe: string;
  model?: string;
  builder: Record<string, unknown>;
  /** Environment for `.slipway/.env` (its values reach the agent, never history), and config files to write, under the run's agent home. */
  env(home: string, key: string): Record<string, string>;
  files?(home: string): Record<string, string>;
  /** The variables that point the CLI's folders at `home`; confined, they are left out and the CLI finds its config where it would in HOME (bound read-only by Slipway). */
  overrides: string[];
  /** The CLI reports a cost. */
  cost: boolean;
  /** The CLI reports token counts (Copilot's JSON has none: its runs record usage as unknown). */
  tokens?: false;
  /** Where it keeps its sessions, under the agent home. */
  sessions: string;
}

const CLIS: Record<RealProvider, Cli> = {
  'claude-code': {
    exe: 'claude',
    model: 'claude-sonnet-4-5',
    builder: { permission_mode: 'acceptEdits' },
    env: (home, key) => ({
      ANTHROPIC_BASE_URL: BASE,
      ANTHROPIC_API_KEY: key,
      CLAUDE_CONFIG_DIR: path.join(home, 'claude'),
      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      DISABLE_AUTOUPDATER: '1',
      DISABLE_TELEMETRY: '1',
    }),
    overrides: ['CLAUDE_CONFIG_DIR'],
    cost: true,
    sessions: 'claude/projects',
  },
  codex: {
    exe: 'codex',
    builder: { permission_mode: 'bypassPermissions' },
    env: (home, key) => ({ CODEX_HOME: path.join(home, '.codex'), FAKE_MODEL_KEY: key }),
    overrides: ['CODEX_HOME'],
    files: (home) => ({
      [path.join(home, '.codex', 'config.toml')]: [
        'model = "gpt-5-codex"',
        'model_provider = "fake"',
        'check_for_update_on_startup = false',
        '[model_providers.fake]',
        'name = "fake"',
        `base_url = "${BASE}/v1"`,
        'env_key = "FAKE_MODEL_KEY"',
        'wire_api = "responses"',
        'request_max_retries = 0',
        'stream_max_retries = 0',
        '[analytics]',
        'enabled = false',
        '',
      ].join('\n'),
    }),
    cost: false,
    sessions: '.codex/sessions',
  },
  pi: {
    exe: 'pi',
    model: 'fake/claude-sonnet-4-5',
    builder: {},
    env: (home, key) => ({ PI_CODING_AGENT_DIR: path.join(home, '.pi', 'agent'), PI_OFFLINE: '1', PI_TELEMETRY: '0', FAKE_MODEL_KEY: key }),
    overrides: ['PI_CODING_AGENT_DIR'],
    files: (home) => ({
      [path.join(home, '.pi', 'agent', 'models.json')]: JSON.stringify({
        providers: {
          fake: {
            baseUrl: BASE,
            api: 'anthropic-messages',
            apiKey: 'FAKE_MODEL_KEY',
            models: [{ id: 'claude-sonnet-4-5', cost: { input: 3, output: 15, cacheRead: 0.3, cacheWrite: 3.75 }, contextWindow: 200000, maxTokens: 8192 }],
          },
        },
      }),
    }),
    cost: true,
    sessions: '.pi/agent/sessions',
  },
  opencode: {
    exe: 'opencode',
    model: 'fake/fake-model',
    builder: { permission_mode: 'bypassPermissions' },
    env: (home, key) => ({
      XDG_CONFIG_HOME: path.join(home, '.config'),
      XDG_DATA_HOME: path.join(home, '.local', 'share'),
      XDG_CACHE_HOME: path.join(home, '.cache'),
      XDG_STATE_HOME: path.join(home, '.local', 'state'),
      OPENCODE_DISABLE_AUTOUPDATE: '1',
      OPENCODE_DISABLE_MODELS_FETCH: '1',
      OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
      OPENCODE_DISABLE_DEFAULT_PLUGINS: '1',
      FAKE_MODEL_KEY: key,
    }),
    overrides: ['XDG_CONFIG_HOME', 'XDG_DATA_HOME', 'XDG_CACHE_HOME', 'XDG_STATE_HOME'],
    files: (home) => ({
      [path.join(home, '.config', 'opencode', 'opencode.json')]: JSON.stringify({
        autoupdate: false,
        share: 'disabled',
        provider: {
          fake: {
            npm: '@ai-sdk/openai-compatible',
            name: 'Fake',
            options: { baseURL: `${BASE}/v1`, apiKey: '{env:FAKE_MODEL_KEY}' },
            models: { 'fake-model': { name: 'Fake model', cost: { input: 3, output: 15 }, limit: { context: 200000, output: 8192 }, tool_call: true } },
          },
        },
      }),
    }),
    cost: true,
    sessions: '.local/share/opencode',
  },
  copilot: {
    exe: 'copilot',
    builder: { permission_mode: 'bypassPermissions' },
    // Its endpoint is all environment (no config file); its state lives in $HOME/.copilot.
    overrides: [],
    // Its bring-your-own-key endpoint (Chat Completions); COPILOT_OFFLINE keeps it off GitHub's services.
    env: (_home, key) => ({
      COPILOT_OFFLINE: 'true',
      COPILOT_PROVIDER_TYPE: 'openai',
      COPILOT_PROVIDER_BASE_URL: `${BASE}/v1`,
      COPILOT_PROVIDER_API_KEY: key,
      COPILOT_MODEL: 'gpt-4.1',
    }),
    cost: false,
    tokens: false,
    sessions: '.copilot/session-state',
  },
};
const PROVIDERS = Object.keys(CLIS) as RealProvider[];
/** The CLIs whose sessions Slipway carries to a fresh agent home (OpenCode's whole SQLite database: ADR 0011 decision 9). */
const CARRIED: RealProvider[] = ['claude-code', 'codex', 'pi', 'opencode', 'copilot'];

let worker: TestWorker;
const endpoints = new Map<string, FakeModel>();
const endpointDir = tempDir('slipway-fake-model-');

beforeAll(async () => {
  const missing = PROVIDERS.filter((p) => !existsSync(path.join(AGENT_BIN, CLIS[p].exe)));
  if (missing.length > 0) throw new Error(`agent CLIs not installed in ${AGENT_BIN}: ${missing.map((p) => CLIS[p].exe).join(', ')}; run scripts/setup.sh`);
  execFileSync('unshare', ['--net', '--', 'true']); // throws, naming unshare, where network namespaces are unavailable
  worker = await startTestWorker({ agentConcurrency: 2 });
});
afterAll(async () => {
  await worker?.stop();
  await Promise.all([...endpoints.values()].map((e) => e.close()));
});

/** Files under `dir` (not following links, skipping git objects) whose content holds `text`. */
function filesHolding(dir: string, text: string): string[] {
  const found: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    const file = path.join(entry.parentPath, entry.name);
    if (!entry.isFile() || file.includes(`${path.sep}.git${path.sep}objects${path.sep}`)) continue;
    if (readFileSync(file).includes(text)) found.push(file);
  }
  return found;
}

/** Processes whose environment holds `marker` (alive, not zombies). */
function processesWith(marker: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${entry}/stat`, 'utf8'))) continue;
      if (readFileSync(`/proc/${entry}/environ`, 'utf8').includes(marker)) found.push(Number(entry));
    } catch {
      /* gone meanwhile */
    }
  }
  return found;
}

/**
 * One objective for `provider`'s real CLI: its own endpoint, agent home and repository, the CLI's
 * settings in `.slipway/.env`. `agentKey` is the key the agent gets (default: the one the endpoint wants).
 */
async function runObjective(
  id: string,
  provider: RealProvider,
  opts: {
    agentKey?: string;
    command?: string;
    objective?: Record<string, unknown>;
    gate?: (home: string, repo: string) => string;
    builder?: Record<string, unknown>;
    /**
     * Under bubblewrap with `network: false`: the sandbox's own namespace has only a loopback. The
     * CLIs' install folder is bound read-only (`readable:`), the endpoint's folder writable; the
     * agent's HOME is the one Slipway makes, with the CLI's config files bound read-only from the
     * HOME the objective's environment names (the test's folder): no variable points the CLI elsewhere.
     */
    confined?: boolean;
  } = {},
) {
  const cli = CLIS[provider];
  const key = `sk-fake-${provider}-${randomBytes(16).toString('hex')}`;
  const marker = `slipway-real-agent-${randomBytes(8).toString('hex')}`;
  const endpoint = await startFakeModel(path.join(endpointDir, `${id}.sock`), key);
  endpoints.set(id, endpoint);
  const home = tempDir(`slipway-agent-home-${provider}-`);
  for (const [file, text] of Object.entries(cli.files?.(home) ?? {})) {
    mkdirSync(path.dirname(file), { recursive: true });
    writeFileSync(file, text);
  }
  const repo = makeDemoRepo();
  mkdirSync(path.join(repo, '.slipway'), { recursive: true });
  const env: Record<string, string> = { HOME: home, SLIPWAY_TEST_MARKER: marker, ...cli.env(home, opts.agentKey ?? key) };
  // Confined, the CLI gets no folder from the test: its sessions go to the agent home Slipway makes,
  // its config is bound there from this HOME (ADR 0011 decision 13), and HOME itself is replaced.
  if (opts.confined) for (const name of cli.overrides) delete env[name];
  writeFileSync(path.join(repo, '.slipway', '.env'), Object.entries(env).map(([k, v]) => `${k}=${v}`).join('\n') + '\n');

  let command = opts.command ?? `unshare --net -- node ${OFFLINE} ${endpoint.socketPath} ${PORT} -- ${path.join(AGENT_BIN, cli.exe)}`;
  let sandbox: Record<string, unknown> | undefined;
  if (opts.confined) {
    // Only the worktree, the objective folder and these are there inside: the forwarder goes beside the endpoint.
    copyFileSync(OFFLINE, path.join(endpointDir, 'offline.mjs'));
    // Bound at their real paths (`.tools` may be a link into another checkout).
    const agents = realpathSync(path.dirname(path.dirname(AGENT_BIN)));
    command = `node ${path.join(endpointDir, 'offline.mjs')} ${endpoint.socketPath} ${PORT} -- ${realpathSync(path.join(AGENT_BIN, cli.exe))}`;
    sandbox = { confinement: 'bubblewrap', network: false, writable: [endpointDir], readable: [agents] };
  }
  const agent = { provider, command, ...(cli.model ? { model: cli.model } : {}), completion_grace_seconds: 2 };
  const file = writeObjective({
    repository: repo,
    objective: 'write the files',
    gates: [{ name: 'fixed', command: `${opts.gate?.(home, repo) ?? ''}test -f fixed.txt || { echo "missing: WRITE:fixed.txt"; exit 1; }` }],
    agents: { builder: { ...agent, ...(opts.builder ?? cli.builder) }, reviewer: agent },
    streams: [{ id: 'files', task: 'Create the file. WRITE:hello.txt' }],
    ...(sandbox ? { sandbox } : {}),
    ...opts.objective,
  });
  const input = await loadObjectiveFile(file, { id });
  const handle = await worker.client.workflow.start(objectiveWorkflow, { taskQueue: worker.taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
  const result = (await handle.result()) as ObjectiveResult;
  return { cli, key, marker, endpoint, repo, home, objectiveDir: path.dirname(file), result };
}

describe('the real agent CLIs, offline against a fake model endpoint', () => {
  it.concurrent.each(PROVIDERS)(
    '%s builds (a file on the stream branch), resumes its session in the gate fix loop, reviews, merges; usage per run matches the endpoint; the key stays out of history and git; no process is left',
    async (provider) => {
      const id = `real-${provider}`;
      const { cli, key, marker, endpoint, repo, objectiveDir, result } = await runObjective(id, provider);
      expect(result.outcome, JSON.stringify(result.streams[0]?.failure)).toBe('completed');

      // The files the CLI wrote with its own tools are on the stream branch and merged.
      const branch = `slipway/${id}/files`;
      for (const ref of [branch, integrationBranch(id)]) {
        expect(gitIn(repo, 'show', `${ref}:hello.txt`)).toBe('written by the agent for hello.txt');
        expect(gitIn(repo, 'show', `${ref}:fixed.txt`)).toBe('written by the agent for fixed.txt');
      }

      // Three runs: build, the gate fix resuming the build's session, review.
      const runs = result.agentRuns ?? [];
      expect(runs.map((r) => `${r.role}:${r.result}`)).toEqual(['builder:signalled', 'builder:signalled', 'reviewer:finished']);
      expect(runs[0].sessionId).toBeTruthy();
      expect(runs[1].resumed).toBe(runs[0].sessionId);
      const served = endpoint.runs();
      expect(served).toHaveLength(3);
      for (const [i, requests] of served.entries()) {
        // cwd and PWD of the process the sandbox started: the stream's sandbox, never the worker's folder.
        const cwds = new Set(requests.flatMap((r) => [r.cwd, r.pwd]));
        expect(cwds.size, `run ${i + 1}: ${[...cwds].join(', ')}`).toBe(1);
        const [cwd] = cwds;
        expect(path.relative(path.join(repo, WORKTREES_DIR), cwd), `run ${i + 1}: cwd ${cwd}`).toMatch(/^[^./][^/]*\/files$/);
        expect(requests.every((r) => r.keyOk)).toBe(true);
        // Usage: what the endpoint served for this run's model turns (side requests without tools, such as titles, are not agent turns).
        const turns = requests.filter((r) => r.answer !== 'text');
        expect(turns.length).toBeGreaterThanOrEqual(i === 2 ? 1 : 2);
        if (cli.tokens === false) expect(runs[i], `run ${i + 1}`).toMatchObject({ inputTokens: 0, outputTokens: 0, usageUnknown: true });
        else expect(runs[i], `run ${i + 1}`).toMatchObject({ inputTokens: turns.length * USAGE.input, outputTokens: turns.length * USAGE.output });
        if (cli.cost) expect(runs[i].costUsd).toBeCloseTo(turns.length * COST_PER_CALL, 9);
        else expect(runs[i].costUsd).toBeUndefined();
      }
      expect(served[2].some((r) => r.answer === 'review')).toBe(true);

      // The key: never in any workflow history, nor in the repository's git objects.
      for (const workflowId of [objectiveWorkflowId(id), streamWorkflowId(id, 'files')]) {
        const text = await historyText(worker.client, workflowId);
        expect(text.includes(key), `the key in the history of ${workflowId}`).toBe(false);
      }
      const objects = execFileSync('sh', ['-c', 'git rev-list --all --objects | cut -d" " -f1 | git cat-file --batch'], { cwd: repo, maxBuffer: 64 * 1024 * 1024 });
      expect(objects.includes(key)).toBe(false);
      // Nor in any file Slipway or the agent left in the repository (its worktrees, records, logs) or the objective's folder; `.slipway/.env` holds it by design.
      const holders = [repo, objectiveDir].flatMap((dir) => filesHolding(dir, key));
      expect(holders).toEqual([path.join(repo, '.slipway', '.env')]); // the scan does see .slipway/

      // Nothing of the runs is left running.
      expect(processesWith(marker)).toEqual([]);
    },
    480_000,
  );

  it.concurrent.each(PROVIDERS)(
    '%s with a rejected key: one run, failed as configuration_error naming the provider and what to set, no retry',
    async (provider) => {
      const { endpoint, result } = await runObjective(`badkey-${provider}`, provider, { agentKey: 'sk-wrong', objective: { on_exhausted: 'fail' } });
      expect(result.outcome).toBe('failed');
      expect(result.streams[0].failure).toMatchObject({ kind: 'configuration_error', summary: expect.stringContaining(`builder agent (${provider}) cannot work as configured`) });
      expect(result.streams[0].failure?.summary).toMatch(/Set [A-Z_]*API_KEY|Set the API key/);
      expect(endpoint.runs()).toHaveLength(1); // one process: the failure was not retried
      expect(endpoint.requests.every((r) => !r.keyOk)).toBe(true);
    },
    240_000,
  );

  it.concurrent.each(PROVIDERS)(
    '%s: a session that cannot be resumed (the agent home was cleaned, and the stream\'s carried copy removed) falls back to a fresh session with the full context, recorded in the run',
    async (provider) => {
      const { endpoint, result } = await runObjective(`lost-${provider}`, provider, {
        gate: (home, repo) => `rm -rf ${path.join(home, CLIS[provider].sessions)} ${path.join(repo, '.slipway', 'agent-sessions')}; `,
      });
      expect(result.outcome, JSON.stringify(result.streams[0]?.failure)).toBe('completed');
      const runs = result.agentRuns ?? [];
      expect(runs.map((r) => `${r.role}:${r.result}`)).toEqual(['builder:signalled', 'builder:signalled', 'reviewer:finished']);
      expect(runs[1].resumed).toBeUndefined();
      expect(runs[1].resumeFailed).toMatch(new RegExp(`^session ${runs[0].sessionId} could not be resumed \\(.+\\); a fresh session got the full context$`));
      expect(runs[1].sessionId).not.toBe(runs[0].sessionId);
      // The fresh session was asked with the whole story: the task and the gate failure.
      const served = endpoint.runs();
      expect(served).toHaveLength(3); // the failed resume never reached the model
      expect(served[1].filter((r) => r.answer === 'tool').length).toBe(1);
      if (CLIS[provider].tokens !== false) expect(runs[1]).toMatchObject({ inputTokens: served[1].filter((r) => r.answer !== 'text').length * USAGE.input });
    },
    360_000,
  );

  it.concurrent.each(CARRIED)(
    '%s: the session is carried: with the agent home\'s sessions gone before the fix run, the stream\'s copy is restored and the same session continues (the model sees the earlier turns)',
    async (provider) => {
      const id = `carried-${provider}`;
      const { endpoint, repo, result } = await runObjective(id, provider, { gate: (home) => `rm -rf ${path.join(home, CLIS[provider].sessions)}; ` });
      expect(result.outcome, JSON.stringify(result.streams[0]?.failure)).toBe('completed');
      const runs = result.agentRuns ?? [];
      expect(runs.map((r) => `${r.role}:${r.result}`)).toEqual(['builder:signalled', 'builder:signalled', 'reviewer:finished']);
      expect(runs[1].resumeFailed).toBeUndefined();
      expect(runs[1].resumed).toBe(runs[0].sessionId);
      const served = endpoint.runs();
      expect(served).toHaveLength(3);
      // The build run's own final answer is in the fix run's conversation: the same session, not a fresh one told the story.
      expect(served[0].every((r) => r.earlierFinals.length === 0)).toBe(true);
      expect(served[1].filter((r) => r.answer !== 'text').every((r) => r.earlierFinals.includes('hello.txt'))).toBe(true);
      // The stream's copy: outside the sandbox, in the repository's Slipway state, never in history.
      const store = path.join(repo, '.slipway', 'agent-sessions', id, 'files', provider, runs[0].sessionId!);
      expect(readdirSync(store, { recursive: true }).length).toBeGreaterThan(0);
    },
    480_000,
  );

  it('codex whose own command sandbox cannot run (workspace-write, CODEX_HOME under the temp folder): its failed tool call, only in the session file, fails the run that changed nothing, with that reason, not retried', async () => {
    // The failed call is read from codex's session file after it ends: a generous completion grace
    // lets it end on its own on a busy machine instead of being killed 2 s after its answer. (Its
    // shutdown record of the call may still be missing; the reader does not need it: ADR 0011, 10.)
    const { endpoint, result } = await runObjective('toolfail-codex', 'codex', { builder: { permission_mode: 'workspace-write', completion_grace_seconds: 30 }, objective: { on_exhausted: 'fail' } });
    expect(result.outcome).toBe('failed');
    expect(result.streams[0].failure).toMatchObject({
      kind: 'configuration_error',
      summary: expect.stringMatching(/builder agent \(codex\) changed nothing: its one tool call failed \(CommandExecution `printf .*hello\.txt` failed \(still running when codex ended\)\); set agents\.builder\.permission_mode: bypassPermissions/),
    });
    expect(endpoint.runs()).toHaveLength(1); // not retried, and no gate fix loop on a run that could not write
  }, 240_000);

  it('claude-code without a permission mode: its write is denied in print mode, so the run that changed nothing fails with that reason (not retried)', async () => {
    const { endpoint, result } = await runObjective('denied-claude-code', 'claude-code', { builder: {}, objective: { on_exhausted: 'fail' } });
    expect(result.outcome).toBe('failed');
    expect(result.streams[0].failure).toMatchObject({
      kind: 'configuration_error',
      summary: expect.stringContaining('builder agent (claude-code) changed nothing: its permission rules denied 1 tool call (Write); set agents.builder.permission_mode'),
    });
    expect(endpoint.runs()).toHaveLength(1);
  }, 240_000);

  it.concurrent.each(PROVIDERS)(
    '%s under bubblewrap (network off, its binary read-only, its own home with the worker HOME\'s config bound read-only, no variable pointing it at a folder): builds, resumes, reviews, merges; neither the binary nor the config is written',
    async (provider) => {
      const binary = realpathSync(path.join(AGENT_BIN, CLIS[provider].exe));
      const sha = (file: string) => createHash('sha256').update(readFileSync(file)).digest('hex');
      const before = sha(binary);
      // Run in the sandbox, as the agent's own commands are (every command of a confined sandbox is): the write must fail.
      const attack = `if touch -c ${binary} 2>/dev/null || sh -c 'echo >> ${binary}' 2>/dev/null; then echo "wrote ${binary}"; exit 3; fi; `;
      const { endpoint, repo, home, result } = await runObjective(`bwrap-${provider}`, provider, { confined: true, gate: () => attack });
      expect(result.outcome, JSON.stringify(result.streams[0]?.failure)).toBe('completed');
      expect(sha(binary)).toBe(before);
      // The HOME the objective names holds the config the test wrote, unchanged, and nothing else: the CLI read it (it reached the fake endpoint) through Slipway's read-only bind.
      const configs = CLIS[provider].files?.(home) ?? {};
      expect(readdirSync(home, { recursive: true, withFileTypes: true }).filter((e) => !e.isDirectory()).map((e) => path.join(e.parentPath, e.name)).sort()).toEqual(Object.keys(configs).sort());
      for (const [file, text] of Object.entries(configs)) expect(readFileSync(file, 'utf8'), file).toBe(text);
      expect(gitIn(repo, 'show', `${integrationBranch(`bwrap-${provider}`)}:fixed.txt`)).toBe('written by the agent for fixed.txt');
      const runs = result.agentRuns ?? [];
      // Its session stayed in Slipway's agent home between runs (an empty tmpfs HOME would lose it).
      expect(runs[1].resumed).toBe(runs[0].sessionId);
      expect(runs[1].resumeFailed).toBeUndefined();
      expect(endpoint.runs()).toHaveLength(3);
    },
    360_000,
  );

  it('claude-code under hard_limit: stopped mid-run once its per-message usage reaches the stream\'s allowance, before its final result; that usage is the spend', async () => {
    // Each model call reports 1,000 prompt tokens: the first message alone reaches the 1,000 allowed.
    const { endpoint, result } = await runObjective('hard-claude-code', 'claude-code', { objective: { budget: { stream: { tokens: 1000 }, hard_limit: true, on_exhausted: 'fail' } } });
    expect(result.outcome).toBe('failed');
    expect(result.streams[0].failure).toMatchObject({ kind: 'budget_exhausted', summary: expect.stringContaining('the run was stopped (hard_limit)') });
    const runs = result.agentRuns ?? [];
    expect(runs.map((r) => `${r.role}:${r.result}`)).toEqual(['builder:budget_stopped']);
    // The running total of its messages (no final result came): at least the first call's prompt.
    expect(runs[0].inputTokens).toBeGreaterThanOrEqual(1000);
    expect(runs[0].inputTokens % 1000).toBe(0);
    // One agent process, not started again (on_exhausted: fail), and at most the calls it made.
    expect(endpoint.runs()).toHaveLength(1);
    expect(runs[0].inputTokens).toBeLessThanOrEqual(endpoint.runs()[0]!.length * 1000);
    expect(result.usage.inputTokens).toBe(runs[0].inputTokens);
  }, 240_000);

  it('a missing executable fails once as configuration_error naming it, not as a transient error retried six times', async () => {
    const { endpoint, result } = await runObjective('missing-exe', 'claude-code', { command: '/nonexistent/claude', objective: { on_exhausted: 'fail' } });
    expect(result.outcome).toBe('failed');
    expect(result.streams[0].failure).toMatchObject({ kind: 'configuration_error', summary: expect.stringContaining('"/nonexistent/claude" was not found on the worker') });
    expect(endpoint.requests).toHaveLength(0);
  }, 240_000);
});
