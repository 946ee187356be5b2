/**
 * Activities: everything with side effects. Built as factories so tests and workers inject
 * real dependencies (sandbox provider, logger).
 */
import path from 'node:path';
import { integrationBranch, MERGER_SANDBOX_NAME } from '../core/ids';
import type { GateSpec, SandboxInfo, SandboxInput } from '../core/types';
import type { SandboxOptions } from '../core/types';
import { createAgentActivities as createAgentRunActivities } from './agents/run-agent';
import { failure } from './failures';
import { branchExists, git, gitMaybe, gitWithIdentity, isAncestor, isDirty, resolveCommit } from './git';
import { withHeartbeat } from './heartbeat';
import { tail } from './process';
import { redact } from './redact';
import { LocalSandboxProvider, localSandboxRoot } from './sandbox/local';
import { createMergerSandbox, createStreamSandbox } from './sandbox/objective-sandboxes';
import type { SandboxProvider } from './sandbox/provider';

/** Characters of command output kept in workflow history per gate or agent run. */
export const OUTPUT_TAIL_CHARS = 6_000;

export interface ActivityDeps {
  sandboxes: SandboxProvider;
}

export function defaultActivityDeps(): ActivityDeps {
  return { sandboxes: new LocalSandboxProvider() };
}

export interface GateResult {
  name: string;
  command: string;
  passed: boolean;
  exitCode: number | null;
  timedOut: boolean;
  durationMs: number;
  output: string;
}

export interface GateRunResult {
  passed: boolean;
  results: GateResult[];
  /** Output of the failing gates, for the builder's next iteration. */
  failureReport: string;
}

export type MergeOutcome =
  | { status: 'merged'; commit: string; previous: string; alreadyMerged: boolean }
  | { status: 'conflict'; files: string[]; details: string };

export function createActivities(deps: ActivityDeps = defaultActivityDeps()) {
  const { sandboxes } = deps;
  return {
    /** Creates the integration branch at the base commit and the merger worktree. Idempotent. */
    async prepareObjective(input: { objectiveId: string; repository: string; baseBranch: string; sandbox?: SandboxOptions }) {
      const baseCommit = await resolveCommit(input.repository, input.baseBranch).catch(() => {
        throw failure('configuration_error', `base branch "${input.baseBranch}" does not exist in ${input.repository}`);
      });
      const branch = integrationBranch(input.objectiveId);
      const merger = await createMergerSandbox(sandboxes, { objectiveId: input.objectiveId, repository: input.repository, baseCommit, branch, sandbox: input.sandbox });
      return { baseCommit, integrationBranch: branch, mergerPath: merger.root };
    },

    /** Creates (or finds again) a stream's sandbox with the objective's sandbox options; heartbeats through setup. */
    async createSandbox(input: SandboxInput): Promise<SandboxInfo> {
      return createStreamSandbox(sandboxes, input);
    },

    async destroySandbox(input: { repository: string; path: string }): Promise<void> {
      await sandboxes.destroy({ repository: input.repository, root: input.path });
    },

    /** Commits whatever the builder left uncommitted. Returns the new head. */
    async commitWork(input: { path: string; message: string }): Promise<{ head: string; committed: boolean }> {
      let committed = false;
      if (await isDirty(input.path)) {
        await git(input.path, ['add', '-A']);
        await gitWithIdentity(input.path, ['commit', '--no-verify', '-q', '-m', input.message]);
        committed = true;
      }
      return { head: await git(input.path, ['rev-parse', 'HEAD']), committed };
    },

    /** Runs gates in order inside a sandbox; stops at the first failure. Never throws for a failing gate. */
    async runGates(input: { path: string; gates: GateSpec[] }): Promise<GateRunResult> {
      return withHeartbeat(async (signal, beat) => {
        const results: GateResult[] = [];
        for (const gate of input.gates) {
          beat({ gate: gate.name });
          const run = await sandboxes.exec(
            { root: input.path },
            { command: gate.command, shell: true, timeoutMs: gate.timeout_seconds * 1000, signal, env: { CI: 'true' } },
          );
          if (run.cancelled) throw failure('unknown', `gate ${gate.name} cancelled`);
          const output = redact(tail(`${run.stdout}${run.stderr ? `\n${run.stderr}` : ''}`.trim(), OUTPUT_TAIL_CHARS));
          const passed = run.exitCode === 0 && !run.timedOut;
          results.push({ name: gate.name, command: gate.command, passed, exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs, output });
          if (!passed) break;
        }
        const failed = results.filter((r) => !r.passed);
        const failureReport = failed
          .map((r) => `Gate "${r.name}" (${r.command}) ${r.timedOut ? 'timed out' : `exited with ${r.exitCode}`}:\n${r.output}`)
          .join('\n\n');
        return { passed: failed.length === 0, results, failureReport };
      });
    },

    /**
     * Merges a stream branch into the integration branch checked out in the merger worktree.
     * Idempotent: a stream head already contained in the integration branch is reported as merged.
     * A conflict is aborted and reported, never resolved by taking one side.
     */
    async mergeStream(input: { mergerPath: string; branch: string; headCommit: string; message: string }): Promise<MergeOutcome> {
      const head = await git(input.mergerPath, ['rev-parse', 'HEAD']);
      if (await isAncestor(input.mergerPath, input.headCommit, head)) {
        const previous = (await gitMaybe(input.mergerPath, ['rev-parse', 'HEAD^1'])) ?? head;
        const isMergeOfStream = (await gitMaybe(input.mergerPath, ['rev-parse', 'HEAD^2'])) === input.headCommit;
        return { status: 'merged', commit: head, previous: isMergeOfStream ? previous : head, alreadyMerged: true };
      }
      // A previous attempt may have died mid-merge.
      await gitMaybe(input.mergerPath, ['merge', '--abort']);
      await git(input.mergerPath, ['reset', '--hard', '-q', head]);
      try {
        await gitWithIdentity(input.mergerPath, ['merge', '--no-ff', '--no-edit', '-m', input.message, input.headCommit]);
      } catch (e) {
        const files = (await gitMaybe(input.mergerPath, ['diff', '--name-only', '--diff-filter=U']))?.split('\n').filter(Boolean) ?? [];
        await gitMaybe(input.mergerPath, ['merge', '--abort']);
        await git(input.mergerPath, ['reset', '--hard', '-q', head]);
        return { status: 'conflict', files, details: tail((e as Error).message, OUTPUT_TAIL_CHARS) };
      }
      return { status: 'merged', commit: await git(input.mergerPath, ['rev-parse', 'HEAD']), previous: head, alreadyMerged: false };
    },

    /** Moves the integration branch back to `commit` (undoing a merge whose post-merge gates failed). */
    async resetIntegration(input: { mergerPath: string; commit: string }): Promise<void> {
      await gitMaybe(input.mergerPath, ['merge', '--abort']);
      await git(input.mergerPath, ['reset', '--hard', '-q', input.commit]);
      await git(input.mergerPath, ['clean', '-fdq']);
    },

    /**
     * Moves a stream's sandbox onto the current integration branch after a merge conflict, keeping
     * the stream's previous change as a diff for the builder to re-apply. Idempotent.
     */
    async resetOntoIntegration(input: { path: string; onto: string }): Promise<{ head: string; previousDiff: string }> {
      const onto = await resolveCommit(input.path, input.onto);
      const head = await git(input.path, ['rev-parse', 'HEAD']);
      const base = (await gitMaybe(input.path, ['merge-base', onto, head])) ?? onto;
      const previousDiff = redact(tail(await git(input.path, ['diff', '--stat', '--patch', base, head]), OUTPUT_TAIL_CHARS));
      await gitMaybe(input.path, ['merge', '--abort']);
      await git(input.path, ['reset', '--hard', '-q', onto]);
      await git(input.path, ['clean', '-fdq']);
      return { head: onto, previousDiff };
    },

    /** Removes the merger worktree; the integration branch stays. */
    async finishObjective(input: { repository: string; objectiveId: string }): Promise<{ integrationHead?: string }> {
      const branch = integrationBranch(input.objectiveId);
      const integrationHead = (await branchExists(input.repository, branch)) ? await resolveCommit(input.repository, branch) : undefined;
      await sandboxes.destroy({ repository: input.repository, root: localSandboxRoot(input.repository, input.objectiveId, MERGER_SANDBOX_NAME) });
      return { integrationHead };
    },
  };
}

/** Agent runs live in agents/run-agent.ts; the workers build them from the same deps. */
export function createAgentActivities(deps: ActivityDeps = defaultActivityDeps()) {
  return createAgentRunActivities(deps);
}
export type { AgentRunInput, AgentRunResult } from './agents/run-agent';

export type SlipwayActivities = ReturnType<typeof createActivities>;
export type SlipwayAgentActivities = ReturnType<typeof createAgentActivities>;

/** Where an objective's worktrees live, for cleanup and display. */
export const objectiveWorktreesDir = (repository: string, objectiveId: string) => path.join(repository, '.slipway', 'worktrees', objectiveId);
