/**
 * Children get a true PWD: every process Slipway spawns sees `PWD` equal to its own (real) cwd and
 * no `OLDPWD`/`INIT_CWD`, whatever the worker's own environment says. OpenCode takes its working
 * directory from `$PWD`, so an inherited PWD pointing at the user's checkout sent its writes there.
 *
 * The probe is node, not a shell: /bin/sh repairs a wrong PWD at start-up and would hide the bug.
 */
import { mkdirSync, readFileSync, realpathSync, symlinkSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { AgentSchema, type AgentProviderKind } from '../core/objective-schema';
import { createAgentActivities, type AgentRunInput } from '../activities/agents/run-agent';
import { childEnv, runProcess } from '../activities/process';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { SANDBOX_WORKSPACE, BWRAP_MISSING_MESSAGE } from '../activities/sandbox/bubblewrap';
import { gitIn, tempDir } from './helpers/repo';
import { scriptAgentInput } from './helpers/agent-run';

const PROBE_SOURCE = `
const fs = require('node:fs');
const out = process.env.PROBE_OUT || require('node:path').join(process.env.SLIPWAY_OBJECTIVE_DIR, 'probe-' + (process.env.PROBE_NAME || 'x') + '.json');
fs.writeFileSync(out, JSON.stringify({ PWD: process.env.PWD ?? null, OLDPWD: process.env.OLDPWD ?? null, INIT_CWD: process.env.INIT_CWD ?? null, IS_SANDBOX: process.env.IS_SANDBOX ?? null, cwd: process.cwd() }));
`;

let saved: Record<string, string | undefined>;
let elsewhere: string;
let probe: string;

beforeEach(() => {
  // The worker was started somewhere else entirely (the user's checkout, in the bug report).
  elsewhere = tempDir('slipway-user-checkout-');
  saved = { PWD: process.env.PWD, OLDPWD: process.env.OLDPWD, INIT_CWD: process.env.INIT_CWD, IS_SANDBOX: process.env.IS_SANDBOX };
  // The worker's own IS_SANDBOX must not reach an unconfined agent (Claude Code would bypass its permissions as root).
  process.env.IS_SANDBOX = '1';
  process.env.PWD = elsewhere;
  process.env.OLDPWD = elsewhere;
  process.env.INIT_CWD = elsewhere;
  probe = path.join(tempDir('slipway-probe-'), 'probe.cjs');
  writeFileSync(probe, PROBE_SOURCE);
});
afterEach(() => {
  for (const [k, v] of Object.entries(saved)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
});

type Seen = { PWD: string | null; OLDPWD: string | null; INIT_CWD: string | null; IS_SANDBOX: string | null; cwd: string };

describe('runProcess', () => {
  it('gives the child PWD = its real cwd and drops OLDPWD and INIT_CWD, with the inherited environment', async () => {
    const sandbox = tempDir('slipway-sandbox-');
    const out = path.join(sandbox, 'seen.json');
    const run = await runProcess({ command: process.execPath, args: [probe], cwd: sandbox, env: { ...process.env, PROBE_OUT: out } });
    expect(run.exitCode).toBe(0);
    const seen = JSON.parse(readFileSync(out, 'utf8')) as Seen;
    expect(seen.PWD).toBe(realpathSync(sandbox));
    expect(seen.PWD).toBe(seen.cwd);
    expect(seen.OLDPWD).toBeNull();
    expect(seen.INIT_CWD).toBeNull();
  });

  it('also when no env is given (the worker environment is the default) and for shell commands', async () => {
    const sandbox = tempDir('slipway-sandbox-');
    const out = path.join(sandbox, 'seen.json');
    process.env.PROBE_OUT = out;
    try {
      const run = await runProcess({ command: `"${process.execPath}" "${probe}"`, shell: true, cwd: sandbox });
      expect(run.exitCode).toBe(0);
    } finally {
      delete process.env.PROBE_OUT;
    }
    const seen = JSON.parse(readFileSync(out, 'utf8')) as Seen;
    expect(seen.PWD).toBe(realpathSync(sandbox));
    expect(seen.OLDPWD).toBeNull();
  });

  it('resolves a cwd reached through a symlink to its real path', async () => {
    const real = tempDir('slipway-real-');
    const link = path.join(tempDir('slipway-link-'), 'via-link');
    symlinkSync(real, link);
    const out = path.join(real, 'seen.json');
    await runProcess({ command: process.execPath, args: [probe], cwd: link, env: { PROBE_OUT: out } });
    expect((JSON.parse(readFileSync(out, 'utf8')) as Seen).PWD).toBe(realpathSync(real));
  });

  it('childEnv keeps everything else and does not touch the given object', () => {
    const given = { PWD: '/x', OLDPWD: '/y', npm_config_local_prefix: '/x', npm_package_json: '/x/package.json', npm_config_registry: 'https://r', KEEP: 'me' };
    const env = childEnv('/', given);
    expect(env).toEqual({ PWD: '/', npm_config_registry: 'https://r', KEEP: 'me' });
    expect(given.PWD).toBe('/x');
  });
});

describe('agent runs (every provider goes through the sandbox exec path)', () => {
  const PROVIDERS: AgentProviderKind[] = ['script', 'claude-code', 'codex', 'opencode', 'pi'];

  it.each(PROVIDERS)('%s: the agent process sees PWD = its sandbox, and no IS_SANDBOX (it is not confined)', async (provider) => {
    const repo = tempDir('slipway-repo-');
    gitIn(repo, 'init', '-q', '-b', 'main');
    const sandbox = path.join(repo, 'wt');
    mkdirSync(sandbox);
    const objectiveDir = tempDir('slipway-objective-');
    // A provider's command line is `command` plus the provider's own flags; the probe ignores them.
    const command = provider === 'script' ? `PROBE_NAME=${provider} "${process.execPath}" "${probe}"` : `${process.execPath} ${probe}`;
    const spec = AgentSchema.parse({ provider, command, completion_grace_seconds: 1 });
    const input: AgentRunInput = {
      role: 'builder',
      spec,
      sandboxPath: sandbox,
      repository: repo,
      objectiveDir,
      objective: { id: 'o', text: 'objective' },
      stream: { id: 's', task: 'task', branch: 'slipway/o/s' },
      targetBranch: 'slipway/o/integration',
      iteration: 1,
    };
    const activities = createAgentActivities({ sandboxes: new LocalSandboxProvider() });
    const result = (await new MockActivityEnvironment().run(activities.runAgent, input)) as Awaited<ReturnType<typeof activities.runAgent>>;
    expect(result.exitCode).toBe(0);
    const file = path.join(objectiveDir, `probe-${provider === 'script' ? 'script' : 'x'}.json`);
    const seen = JSON.parse(readFileSync(file, 'utf8')) as Seen;
    expect(seen.PWD).toBe(realpathSync(sandbox));
    expect(seen.PWD).not.toBe(elsewhere);
    expect(seen.OLDPWD).toBeNull();
    expect(seen.IS_SANDBOX).toBeNull();
  });
});

describe('a wrapper that changes directory itself (bwrap --chdir)', () => {
  it('PWD is the directory given as pwd, where the real program runs', async () => {
    const outer = tempDir('slipway-outer-');
    const inner = path.join(outer, 'sub');
    mkdirSync(inner);
    const out = path.join(outer, 'seen.json');
    // A node wrapper stands in for `bwrap --chdir sub -- node probe`: it changes directory and passes its environment on untouched (a shell's cd would fix PWD itself).
    const wrapper = `process.chdir('sub'); require('node:child_process').execFileSync(process.execPath, [${JSON.stringify(probe)}], { stdio: 'inherit' });`;
    const run = await runProcess({ command: process.execPath, args: ['-e', wrapper], cwd: outer, pwd: inner, env: { PROBE_OUT: out } });
    expect(run.exitCode).toBe(0);
    const seen = JSON.parse(readFileSync(out, 'utf8')) as Seen;
    expect(seen.PWD).toBe(realpathSync(inner));
    expect(seen.cwd).toBe(realpathSync(inner));
  });
});

describe('under bubblewrap', () => {
  it('a confined script agent sees PWD = its sandbox, not the worker\'s, and IS_SANDBOX=1', async () => {
    const repo = tempDir('slipway-repo-');
    gitIn(repo, 'init', '-q', '-b', 'main');
    writeFileSync(path.join(repo, 'README'), 'hi\n');
    gitIn(repo, 'add', '.');
    gitIn(repo, '-c', 'user.email=t@example.com', '-c', 'user.name=t', 'commit', '-q', '-m', 'init');
    let sandboxes: LocalSandboxProvider;
    try {
      sandboxes = new LocalSandboxProvider({ confinement: { kind: 'bubblewrap', network: false }, backgroundFill: false });
    } catch (e) {
      throw new Error(`this test needs bubblewrap: ${BWRAP_MISSING_MESSAGE} (${(e as Error).message})`);
    }
    const handle = await sandboxes.create({ sandboxId: 't.pwd', repository: repo, group: 'obj', name: 'pwd', branch: 'slipway/obj/pwd', base: 'main' });
    // Inside the sandbox /tmp is private: the probe and its output live in the worktree.
    writeFileSync(path.join(handle.root, 'probe.cjs'), PROBE_SOURCE);
    const out = path.join(handle.root, 'seen.json');
    mkdirSync(path.join(repo, '.slipway'), { recursive: true });
    writeFileSync(path.join(repo, '.slipway', '.env'), `PROBE_OUT=${out}\n`);
    const input = scriptAgentInput({ command: `"${process.execPath}" probe.cjs`, sandboxPath: handle.root, repository: repo, objectiveDir: tempDir('slipway-objective-'), stream: 'pwd' });
    const activities = createAgentActivities({ sandboxes });
    await new MockActivityEnvironment().run(activities.runAgent, input);
    const seen = JSON.parse(readFileSync(out, 'utf8')) as Seen;
    // Confined, the sandbox sees itself at its fixed path, never its host path (ADR 0006).
    expect(seen.PWD).toBe(SANDBOX_WORKSPACE);
    expect(seen.PWD).toBe(seen.cwd);
    expect(seen.OLDPWD).toBeNull();
    expect(seen.INIT_CWD).toBeNull();
    expect(seen.IS_SANDBOX).toBe('1');
  });
});
