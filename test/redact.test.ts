/**
 * One redaction set: the worker's environment, the repository's `.slipway/.env`, its `.env` and
 * `.env.*` files (which copy_ignored copies into every worktree), and registered tokens. A secret
 * that lives only in the repository's `.env` must not come back from an agent run, a gate run or
 * the diff kept after a merge conflict.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { MockActivityEnvironment } from '@temporalio/testing';
import { ApplicationFailure } from '@temporalio/common';
import { describe, expect, it } from 'vitest';
import { createAgentActivities, type AgentRunResult } from '../activities/agents/run-agent';
import { createActivities, type GateRunResult } from '../activities/index';
import { knownSecrets, redact, redactorFor, registerSecrets, repositoryOfSandbox, repositorySecrets, secretsFor } from '../activities/redact';
import { LocalSandboxProvider } from '../activities/sandbox/local';
import { gitIn, tempDir } from './helpers/repo';
import { scriptAgentInput } from './helpers/agent-run';

const secret = (label: string) => `${label}-${randomBytes(10).toString('hex')}`;

/** A repository with a secret only in its root `.env`, and a stream worktree at Slipway's layout with that `.env` copied in (as copy_ignored does). */
function repoWithDotenv(): { repo: string; sandbox: string; value: string } {
  const repo = tempDir('slipway-redact-repo-');
  gitIn(repo, 'init', '-q', '-b', 'main');
  writeFileSync(path.join(repo, '.gitignore'), '.env\n.slipway/\n');
  writeFileSync(path.join(repo, 'README'), 'hello\n');
  gitIn(repo, 'add', '.');
  gitIn(repo, '-c', 'user.email=t@example.com', '-c', 'user.name=t', 'commit', '-q', '-m', 'init');
  const value = secret('dbpw');
  // The name does not look secret: the value is redacted because it sits in a .env file.
  writeFileSync(path.join(repo, '.env'), `NODE_ENV=development\nDATABASE_URL="postgres://app:${value}@db/app"\n`);
  const sandbox = path.join(repo, '.slipway', 'worktrees', 'obj', 'api');
  mkdirSync(path.dirname(sandbox), { recursive: true });
  gitIn(repo, 'worktree', 'add', '-q', '-b', 'slipway/obj/api', sandbox, 'main');
  copyFileSync(path.join(repo, '.env'), path.join(sandbox, '.env'));
  return { repo, sandbox, value };
}

const gateThatPrintsEnv = { name: 'test', command: 'cat .env; echo "leak: $(cat .env)" >&2; exit 1', timeout_seconds: 30 };

describe('the redaction set', () => {
  it('holds values of .slipway/.env, .env and .env.* but not plain settings; is re-read when a file changes', async () => {
    const repo = tempDir('slipway-redact-');
    mkdirSync(path.join(repo, '.slipway'));
    const [a, b, c, d] = [secret('a'), secret('b'), secret('c'), secret('d')];
    writeFileSync(path.join(repo, '.slipway', '.env'), `AGENT_KEY=${a}\n`);
    writeFileSync(path.join(repo, '.env'), `export URL='https://u:${b}@h'\nPORT=8080\nMODE=development\nFLAG=true\n`);
    writeFileSync(path.join(repo, '.env.local'), `KEY="-----BEGIN-----\n${c}${c}\n-----END-----"\n`);
    const secrets = await repositorySecrets(repo);
    expect(secrets).toEqual(expect.arrayContaining([a, `https://u:${b}@h`, `${c}${c}`]));
    expect(secrets).not.toEqual(expect.arrayContaining(['8080']));
    expect(secrets.some((s) => s === 'development' || s === 'true')).toBe(false);
    const text = `a=${a} url=https://u:${b}@h line=${c}${c} port=8080 mode=development`;
    expect((await redactorFor(repo))(text)).toBe('a=[redacted] url=[redacted] line=[redacted] port=8080 mode=development');

    writeFileSync(path.join(repo, '.env.production'), `S=${d}\n`);
    expect(await repositorySecrets(repo)).toContain(d);
  });

  it('skips a FIFO or an oversized .env instead of blocking or loading it', async () => {
    const repo = tempDir('slipway-redact-');
    execFileSync('mkfifo', [path.join(repo, '.env')]);
    writeFileSync(path.join(repo, '.env.big'), `X=${'y'.repeat(2 * 1024 * 1024)}\n`);
    const v = secret('ok');
    writeFileSync(path.join(repo, '.env.ok'), `V=${v}\n`);
    // Would hang on the FIFO without O_NONBLOCK + the regular-file check (the test times out).
    expect(await repositorySecrets(repo)).toEqual([v]);
  });

  it('includes the worker environment and registered tokens; redact() without a set uses everything known', async () => {
    const token = secret('grant');
    registerSecrets([token, 'abc']); // too short to be a secret: ignored
    const envSecret = secret('env');
    const set = knownSecrets({ MY_API_TOKEN: envSecret, HOME: '/home/x' });
    expect(set).toEqual(expect.arrayContaining([token, envSecret]));
    expect(set).not.toContain('abc');
    expect(set).not.toContain('/home/x');
    expect(redact(`t=${token}`)).toBe('t=[redacted]');

    const { repo, value } = repoWithDotenv();
    const url = `postgres://app:${value}@db/app`;
    expect(redact(`v=${url}`)).toBe(`v=${url}`); // not read yet
    await secretsFor(repo);
    expect(redact(`v=${url}`)).toBe('v=[redacted]');
  });

  it('finds the repository of a sandbox from Slipway\'s layout only', () => {
    expect(repositoryOfSandbox('/r/repo/.slipway/worktrees/obj/api')).toBe('/r/repo');
    expect(repositoryOfSandbox('/r/repo/.slipway/worktrees/obj/api/sub/dir')).toBe('/r/repo');
    expect(repositoryOfSandbox('/srv/sandboxes/x')).toBeUndefined();
  });
});

describe('what activities return', () => {
  it('an agent run: a secret only in the repository .env is not in its output or its failure', async () => {
    const { repo, sandbox, value } = repoWithDotenv();
    const activities = createAgentActivities({ sandboxes: new LocalSandboxProvider() });
    const input = (command: string) => scriptAgentInput({ command, sandboxPath: sandbox, repository: repo, objectiveDir: tempDir('slipway-objective-'), stream: 'api' });
    const ok = (await new MockActivityEnvironment().run(activities.runAgent, input('cat .env'))) as AgentRunResult;
    expect(ok.output).toContain('DATABASE_URL="[redacted]"');
    expect(ok.output).not.toContain(value);

    const failed = new MockActivityEnvironment().run(activities.runAgent, input('cat .env >&2; exit 3'));
    const error = (await failed.catch((e: unknown) => e)) as ApplicationFailure;
    expect(error).toBeInstanceOf(ApplicationFailure);
    expect(error.message).toContain('[redacted]');
    expect(error.message).not.toContain(value);
  });

  /** A worker that runs a gate before anything else read the repository (just restarted). */
  it('a cold worker: runGates failure report never shows a secret only in the repository .env', async () => {
    const { sandbox, value } = repoWithDotenv();
    const activities = createActivities({ sandboxes: new LocalSandboxProvider() });
    const result = (await new MockActivityEnvironment().run(activities.runGates, { path: sandbox, gates: [gateThatPrintsEnv] })) as GateRunResult;
    expect(result.failureReport).not.toContain(value);
  });

  it('runGates and resetOntoIntegration (the diff kept for the rebuild) hide a secret only in the repository .env', async () => {
    const { repo, sandbox, value } = repoWithDotenv();
    // What a worker does before a stream's gates: create the sandbox and run its builder, which reads the repository's set.
    await secretsFor(sandbox);
    const activities = createActivities({ sandboxes: new LocalSandboxProvider() });
    const env = new MockActivityEnvironment();

    const gates = (await env.run(activities.runGates, { path: sandbox, gates: [gateThatPrintsEnv] })) as GateRunResult;
    expect(gates.passed).toBe(false);
    expect(gates.failureReport).toContain('[redacted]');
    expect(gates.failureReport).not.toContain(value);
    expect(JSON.stringify(gates.results)).not.toContain(value);

    // A builder that committed the secret; a merge conflict resets the stream and keeps its diff.
    writeFileSync(path.join(sandbox, 'config.js'), `module.exports = { db: "postgres://app:${value}@db/app" };\n`);
    gitIn(sandbox, 'add', 'config.js');
    gitIn(sandbox, '-c', 'user.email=t@example.com', '-c', 'user.name=t', 'commit', '-q', '-m', 'oops');
    const reset = (await env.run(activities.resetOntoIntegration, { path: sandbox, onto: 'main' })) as { previousDiff: string };
    expect(reset.previousDiff).toContain('config.js');
    expect(reset.previousDiff).toContain('[redacted]');
    expect(reset.previousDiff).not.toContain(value);
    expect(repo).toBeTruthy();
  });
});
