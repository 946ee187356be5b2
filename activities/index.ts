/**
 * Activities: everything with side effects. Built as factories so tests and workers inject
 * real dependencies (sandbox provider, logger).
 */
import path from 'node:path';
import { ANY_OWNER, BRANCH_PREFIX, integrationBranch, MERGER_SANDBOX_NAME } from '../core/ids';
import type { GateSpec, SandboxInfo, SandboxInput } from '../core/types';
import type { RemoteRepository, SandboxOptions } from '../core/types';
import { createAgentActivities as createAgentRunActivities } from './agents/run-agent';
import { failure } from './failures';
import { branchExists, commitIdentityVariables, commonDirOf, GitError, gitAnswer, gitHasMergeTree, mergeTrees, rawGit, rawGitWithInput, resolveCommit, stripspace } from '../lib/git';
import { clearStaleGitLocks } from './git-locks';
import { mirroredRemote, pushToRemote, syncMirror } from '../lib/remote-repository';
import { classifyRepositorySpec } from '../core/repository-spec';
import { claimObjectiveId } from './objective-id';
import { Context } from '@temporalio/activity';
import { heartbeating, withHeartbeat } from './heartbeat';
import { tail } from './process';
import { redactorFor } from './redact';
import { LocalSandboxProvider, localSandboxRoot, parseSandboxRoot, sandboxRecordPath } from './sandbox/local';
import { readJson, writeJsonAtomic } from '../lib/atomic-write';
import { discardSandboxGit, locateWorktree, OBJECT_ID, trustedWorktreeArgs } from './sandbox/sandbox-git';
import { promises as fs, writeFileSync } from 'node:fs';
import os from 'node:os';
import { createMergerSandbox, createStreamSandbox, registerMergerObjective } from './sandbox/objective-sandboxes';
import { clearSandboxGitLocks, commitSandboxWork, sandboxGit, type CommittedWork } from './sandbox/commit-work';
import type { SandboxLiveness, SandboxProvider } from './sandbox/provider';
import type { TemporalHome } from './sandbox/registry';
import { SandboxProviders } from './sandbox/router';
import { parseContainerRoot } from './sandbox/container';

/** Characters of command output kept in workflow history per gate or agent run. */
export const OUTPUT_TAIL_CHARS = 6_000;

export interface ActivityDeps {
  sandboxes: SandboxProvider;
  /** The Temporal cluster and namespace this worker serves, recorded for the janitor (activities/sandbox/registry.ts). */
  temporalHome?: () => Promise<TemporalHome>;
  /** This worker's id (workers/worker.ts): the owner of what it creates on a host-bound provider. */
  workerId?: string;
  /**
   * Merge with git's plumbing, without a worktree (docs/adr/0033): by default when this host's git
   * has `merge-tree --write-tree` (2.38); false merges in the merger worktree as on an older git.
   */
  mergeTree?: boolean;
}

export function defaultActivityDeps(): ActivityDeps {
  // Each sandbox on the provider its options name (local, podman, docker); the merger is local.
  return { sandboxes: new SandboxProviders(new LocalSandboxProvider()) };
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
  /** With `commit` and every gate passed: the sandbox's work committed and collected. */
  commit?: CommittedWork;
}

export type MergeOutcome =
  | { status: 'merged'; commit: string; previous: string; alreadyMerged: boolean }
  | { status: 'no_changes'; summary: string }
  | { status: 'conflict'; files: string[]; details: string };

/** What `mergeWithGates` did: the merge, the post-merge gates when they ran, and whether it was reverted. */
export interface MergedWithGates {
  merge: MergeOutcome;
  gates?: { passed: boolean; failureReport: string };
  reset?: boolean;
}

/**
 * This worker's clone of an objective's remote repository, fetched now (lib/remote-repository.ts).
 * A remote it cannot read ends the objective before anything started: a configuration error
 * naming the remote (as written, credential-free) and git's last words.
 */
async function mirrorForObjective(display: string, remote: RemoteRepository): Promise<{ repository: string; baseBranch: string }> {
  try {
    const { root, baseBranch } = await syncMirror(remote, remote.baseBranch);
    return { repository: root, baseBranch };
  } catch (e) {
    const reason = e instanceof GitError ? e.stderr.trim().split('\n').slice(-3).join('; ') || e.message : (e as Error).message;
    throw failure('configuration_error', `cannot fetch ${display}: ${reason}`);
  }
}

/** What `prepareObjective` made; `repository` and `baseBranch` are the owner's clone's, for a remote repository. */
export interface PreparedObjective {
  baseCommit: string;
  integrationBranch: string;
  mergerPath: string;
  integrationTip: string;
  /** Only the integration branch was made: the merger has no worktree, and none is to be made (docs/adr/0033). */
  withoutMerger?: true;
  repository?: string;
  baseBranch?: string;
  owner?: string;
}

/** What `mergeBatch` did: each stream's merge in order, the post-merge gates on all of them, and whether the batch was reverted. */
export interface MergedBatch {
  merges: MergeOutcome[];
  gates?: { passed: boolean; failureReport: string };
  reset?: boolean;
}

export function createActivities(deps: ActivityDeps = defaultActivityDeps()) {
  const { sandboxes } = deps;
  // Who holds what this worker creates: itself for a host-bound provider, any worker otherwise.
  const ownedOn = (provider: SandboxProvider) => {
    const owner = provider.hostBound ? deps.workerId : ANY_OWNER;
    return owner ? { owner } : {};
  };
  const owned = ownedOn(sandboxes instanceof SandboxProviders ? sandboxes.local : sandboxes);
  const plumbing = async () => deps.mergeTree ?? (await gitHasMergeTree());
  const activities = {
    /**
     * Creates the integration branch at the base commit and the merger worktree. Idempotent.
     * `deferMerger`: only resolves the base and claims the id; `prepareMerger` makes the merger
     * later, in parallel with the streams (docs/adr/0018-orchestration-overhead.md).
     * `withoutMerger` (with `deferMerger`): nothing but merges would run in the merger, so when
     * this host's git merges without a worktree only the integration branch is made, and the
     * result says so (`withoutMerger: true`: no `prepareMerger` follows; docs/adr/0033).
     */
    async prepareObjective(input: { objectiveId: string; repository: string; baseBranch: string; remote?: RemoteRepository; sandbox?: SandboxOptions; deferMerger?: boolean; withoutMerger?: boolean }): Promise<PreparedObjective> {
      // A remote repository is cloned or fetched here, under this worker's SLIPWAY_HOME and with its
      // git credentials: this worker holds the merger, so it holds the clone (docs/adr/0028).
      const mirrored = input.remote ? await mirrorForObjective(input.repository, input.remote) : undefined;
      if (mirrored) input = { ...input, repository: mirrored.repository, baseBranch: mirrored.baseBranch };
      const base = resolveCommit(input.repository, input.baseBranch).catch(() => {
        throw failure('configuration_error', `base branch "${input.baseBranch}" does not exist in ${input.repository}`);
      });
      const branch = integrationBranch(input.objectiveId);
      // Only the integration branch is made (docs/adr/0033) when nothing but merges would run in
      // the merger and this host's git merges without a worktree: it comes with the claim.
      const withoutMerger = input.deferMerger && input.withoutMerger && (await plumbing());
      // The id names branches in the user's repository: claimed by this run, never reused silently.
      const [resolved, claimed] = await Promise.allSettled([
        base,
        claimObjectiveId(input.repository, input.objectiveId, objectiveClaimOwner(), withoutMerger ? base.then((commit) => [{ name: branch, commit }]) : []),
      ]);
      // A missing base branch is the error to report, also when the id is in use too.
      if (resolved.status === 'rejected') throw resolved.reason;
      if (claimed.status === 'rejected') throw failure('configuration_error', (claimed.reason as Error).message);
      const baseCommit = resolved.value;
      if (input.deferMerger) {
        const mergerPath = localSandboxRoot(input.repository, input.objectiveId, MERGER_SANDBOX_NAME);
        if (withoutMerger) {
          const temporal = await deps.temporalHome?.().catch(() => undefined);
          await registerMergerObjective({ objectiveId: input.objectiveId, repository: input.repository, baseCommit, temporal });
          return { baseCommit, integrationBranch: branch, mergerPath, integrationTip: baseCommit, withoutMerger: true as const, ...mirrored, ...owned };
        }
        return { baseCommit, integrationBranch: branch, mergerPath, integrationTip: baseCommit, ...mirrored, ...owned };
      }
      const temporal = await deps.temporalHome?.().catch(() => undefined);
      const merger = await createMergerSandbox(sandboxes, { objectiveId: input.objectiveId, repository: input.repository, baseCommit, branch, sandbox: input.sandbox, temporal });
      return { baseCommit, integrationBranch: branch, mergerPath: merger.root, integrationTip: merger.headCommit, ...mirrored, ...owned };
    },

    /**
     * The merger worktree (and the integration branch) of an objective prepared with
     * `deferMerger`. Idempotent. `bare`: nothing but git runs in it (no post-merge gates, no
     * objective gates, no planner), so neither ignored files nor project setup go in.
     */
    async prepareMerger(input: { objectiveId: string; repository: string; baseCommit: string; sandbox?: SandboxOptions; bare: boolean }): Promise<{ mergerPath: string; integrationTip: string }> {
      const temporal = await deps.temporalHome?.().catch(() => undefined);
      const merger = await createMergerSandbox(sandboxes, { objectiveId: input.objectiveId, repository: input.repository, baseCommit: input.baseCommit, branch: integrationBranch(input.objectiveId), sandbox: input.sandbox, temporal, bare: input.bare });
      return { mergerPath: merger.root, integrationTip: merger.headCommit };
    },

    /** Creates (or finds again) a stream's sandbox with the objective's sandbox options; heartbeats through setup. */
    async createSandbox(input: SandboxInput): Promise<SandboxInfo> {
      const made = await createStreamSandbox(sandboxes, input);
      return { ...made, ...ownedOn(sandboxes instanceof SandboxProviders ? sandboxes.provider(made.provider) : sandboxes) };
    },

    async destroySandbox(input: { repository: string; path: string }): Promise<void> {
      await sandboxes.destroy({ repository: input.repository, root: input.path });
    },

    /** Is the stream's sandbox still there, or did it die outside Slipway (stopped, archived, deleted)? Read-only: never races a call on the sandbox. */
    async probeSandbox(input: { path: string }): Promise<SandboxLiveness> {
      return (await sandboxes.probe?.({ root: input.path })) ?? { alive: true };
    },

    /**
     * Commits whatever the builder left uncommitted, inside the sandbox, then collects the
     * sandbox's HEAD into the repository. Returns the new head (./sandbox/commit-work.ts).
     */
    async commitWork(input: { path: string; message: string }): Promise<CommittedWork> {
      return commitSandboxWork(sandboxes, input);
    },

    /**
     * Runs gates in order inside a sandbox; stops at the first failure. Never throws for a failing
     * gate. `commit`: when they all pass, what they and the steps before left uncommitted is
     * committed and the head collected, as `commitWork` would (a stream's gates, ADR 0034).
     */
    async runGates(input: { path: string; gates: GateSpec[]; commit?: { message: string } }): Promise<GateRunResult> {
      const [redactor, unlocked] = await Promise.all([redactorFor(input.path), clearSandboxGitLocks(sandboxes, input.path)]);
      // As before an agent run: a gate's git killed with its worker left locks its retry would fail on.
      if (unlocked.length > 0) Context.current().log.warn('stale git locks removed from the sandbox before the gates ran', { locks: unlocked.map((l) => path.basename(l)).join(', ') });
      return withHeartbeat(async (signal, beat) => {
        const results: GateResult[] = [];
        for (const gate of input.gates) {
          beat({ gate: gate.name });
          const run = await sandboxes.exec(
            { root: input.path },
            { command: gate.command, shell: true, timeoutMs: gate.timeout_seconds * 1000, signal, env: { CI: 'true' } },
          );
          if (run.cancelled) throw failure('unknown', `gate ${gate.name} cancelled`);
          const output = redactor(tail(`${run.stdout}${run.stderr ? `\n${run.stderr}` : ''}`.trim(), OUTPUT_TAIL_CHARS));
          const passed = run.exitCode === 0 && !run.timedOut;
          results.push({ name: gate.name, command: gate.command, passed, exitCode: run.exitCode, timedOut: run.timedOut, durationMs: run.durationMs, output });
          if (!passed) break;
        }
        const failed = results.filter((r) => !r.passed);
        const failureReport = failed
          .map((r) => `Gate "${r.name}" (${r.command}) ${r.timedOut ? 'timed out' : `exited with ${r.exitCode}`}:\n${r.output}`)
          .join('\n\n');
        // As in runAgent: a failed commit leaves it to the stream's leftovers commit rather than running the gates again.
        const commit =
          failed.length === 0 && input.commit
            ? await commitSandboxWork(sandboxes, { path: input.path, message: input.commit.message }).catch((e: unknown) => {
                Context.current().log.warn('the gates passed but their leftovers could not be committed; the stream commits them', { error: redactor((e as Error).message) });
                return undefined;
              })
            : undefined;
        return { passed: failed.length === 0, results, failureReport, ...(commit ? { commit } : {}) };
      });
    },

    /**
     * Merges a stream branch into the integration branch: with git's plumbing in the repository's
     * git directory, the merger worktree (where there is one) brought to the result afterwards
     * (docs/adr/0033); on a git without `merge-tree --write-tree`, with `git merge` in the merger
     * worktree. Idempotent: a stream head already contained in the integration branch is reported as merged.
     * A conflict is aborted and reported, never resolved by taking one side. `expectedTip`: the
     * integration commit the merge queue last recorded; anything else means the branch was moved
     * outside the queue, and nothing is merged on top of it.
     */
    async mergeStream(input: { mergerPath: string; branch: string; headCommit: string; message: string; expectedTip?: string }): Promise<MergeOutcome> {
      if (await plumbing()) return mergeByPlumbing(await integrationGit(input.mergerPath), input, { follow: true });
      return mergeInto(await mergerGit(input.mergerPath), input);
    },

    /**
     * One stream's whole merge in one activity: `mergeStream`, then the post-merge gates on the
     * new integration state, then `resetIntegration` to the commit before it when they fail.
     * Retried after a crash at any point it ends as one undisturbed run does: the merge is found
     * again (never made twice), the gates run again, a reset to `previous` is repeatable.
     */
    async mergeWithGates(input: { mergerPath: string; branch: string; headCommit: string; message: string; expectedTip?: string; gates: GateSpec[] }): Promise<MergedWithGates> {
      const { gates: specs, ...request } = input;
      const merge = await activities.mergeStream(request);
      if (merge.status !== 'merged' || specs.length === 0) return { merge };
      const gates = await activities.runGates({ path: input.mergerPath, gates: specs });
      const report = { passed: gates.passed, failureReport: gates.failureReport };
      if (gates.passed) return { merge, gates: report };
      await activities.resetIntegration({ mergerPath: input.mergerPath, commit: merge.previous });
      return { merge, gates: report, reset: true };
    },

    /**
     * Several streams' merges in one activity (docs/adr/0031-batch-merges.md): each stream is
     * merged on top of the one before (`mergeStream`), the post-merge gates run once on the
     * result, and when they fail the integration branch goes back to `expectedTip` (the caller
     * bisects). Idempotent: merges a killed attempt made on top of `expectedTip` (a first-parent
     * line of merge commits of this batch's heads, never reported) are undone first and made
     * again, so the result is one undisturbed run's and no stream is merged twice; any other
     * tip is refused as in `mergeStream`.
     */
    async mergeBatch(input: { mergerPath: string; expectedTip?: string; items: Array<{ branch: string; headCommit: string; message: string }>; gates: GateSpec[] }): Promise<MergedBatch> {
      const g = (await plumbing()) ? await integrationGit(input.mergerPath) : undefined;
      if (input.expectedTip) {
        const heads = new Set(input.items.map((i) => i.headCommit));
        const found = g ? { git: g.git, head: (await g.tip()).commit } : await mergerGit(input.mergerPath).then(async (m) => ({ git: m.git, head: await m.git(['rev-parse', 'HEAD']) }));
        if (await unreportedBatch(found.git, found.head, input.expectedTip, heads)) await activities.resetIntegration({ mergerPath: input.mergerPath, commit: input.expectedTip });
      }
      const merges: MergeOutcome[] = [];
      let tip = input.expectedTip;
      if (g) {
        let known: IntegrationTip | undefined;
        for (const item of input.items) {
          // The worktree, where there is one, is brought to the result once, after the last merge.
          const [merge, after] = await mergeAndTip(g, { ...item, ...(tip ? { expectedTip: tip } : {}) }, { follow: false, known });
          merges.push(merge);
          if (merge.status === 'merged') tip = merge.commit;
          known = after;
        }
        if (merges.some((x) => x.status === 'merged')) await g.follow(tip!, merges.some((x) => x.status === 'merged' && !x.alreadyMerged));
      } else {
        const m = await mergerGit(input.mergerPath);
        for (const [i, item] of input.items.entries()) {
          // After the first, each merge starts where the one before left the merger: clean, at `tip`.
          const merge = await mergeInto(m, { ...item, ...(tip ? { expectedTip: tip } : {}) }, { fresh: false, clean: i > 0 });
          merges.push(merge);
          if (merge.status === 'merged') tip = merge.commit;
        }
        if (merges.some((x) => x.status === 'merged' && !x.alreadyMerged)) await m.freshSandboxGit();
      }
      const start = input.expectedTip;
      if (!merges.some((m) => m.status === 'merged' && !m.alreadyMerged) || input.gates.length === 0) return { merges };
      const gates = await activities.runGates({ path: input.mergerPath, gates: input.gates });
      const report = { passed: gates.passed, failureReport: gates.failureReport };
      if (gates.passed || !start) return { merges, gates: report };
      await activities.resetIntegration({ mergerPath: input.mergerPath, commit: start });
      return { merges, gates: report, reset: true };
    },

    /** Moves the integration branch back to `commit` (undoing a merge whose post-merge gates failed). */
    async resetIntegration(input: { mergerPath: string; commit: string }): Promise<void> {
      if (await plumbing()) {
        const g = await integrationGit(input.mergerPath);
        const { commit: current } = await g.tip();
        if (current !== input.commit) await g.git(['update-ref', '-m', 'slipway: revert to before the merge', g.ref, input.commit, current]);
        await g.follow(input.commit, true, true);
        return;
      }
      const m = await mergerGit(input.mergerPath);
      await m.maybe(['merge', '--abort']);
      await m.git(['reset', '--hard', '-q', input.commit]);
      await m.git(['clean', '-fdq']);
      await m.freshSandboxGit();
    },

    /**
     * Moves a stream's sandbox onto the current integration branch after a merge conflict, keeping
     * the stream's previous change as a diff for the builder to re-apply. Idempotent. The target is
     * resolved in the repository (a commit, not a name the sandbox could redefine); the reset runs
     * inside the sandbox, and the branch follows through collect.
     */
    async resetOntoIntegration(input: { path: string; onto: string }): Promise<{ head: string; previousDiff: string }> {
      const local = parseSandboxRoot(path.resolve(input.path));
      const parsed = local ?? parseContainerRoot(path.resolve(input.path));
      if (!parsed) throw failure('sandbox_failure', `${input.path} is not a Slipway sandbox`);
      const onto = await resolveCommit(parsed.repository, input.onto);
      // A container sandbox has only the commits it started with and made: bring the new tip in.
      await sandboxes.bringCommits?.({ root: input.path }, [onto]);
      const run = sandboxGit(sandboxes, input.path);
      const head = await run(['rev-parse', 'HEAD']);
      // A retry after the reset already happened (the worker died before reporting it) must
      // return the same previous change, not the empty diff of `onto` against itself: the head
      // before the reset is recorded outside the sandbox first.
      const record = local ? `${sandboxRecordPath(local.repository, local.group, local.name)}.rebuild` : `${path.resolve(input.path)}.rebuild.json`;
      const saved = await readJson<{ onto?: string; previous?: string }>(record);
      let previous = head;
      if (saved?.onto === onto && head === onto && saved.previous && OBJECT_ID.test(saved.previous)) previous = saved.previous;
      else await writeJsonAtomic(record, { onto, previous: head }, { mkdir: true });
      const base = (await run(['merge-base', onto, previous]).catch(() => undefined)) ?? onto;
      const previousDiff = (await redactorFor(parsed.repository))(tail(await run(['diff', '--stat', '--patch', base, previous]), OUTPUT_TAIL_CHARS));
      await run(['merge', '--abort']).catch(() => undefined);
      await run(['reset', '--hard', '-q', onto]);
      await run(['clean', '-fdq']);
      await sandboxes.collect({ root: input.path }, { known: [onto] });
      return { head: onto, previousDiff };
    },

    /** Removes the merger worktree; the integration branch stays. */
    async finishObjective(input: { repository: string; objectiveId: string }): Promise<{ integrationHead?: string; pushedTo?: string; pushError?: string }> {
      const branch = integrationBranch(input.objectiveId);
      const integrationHead = (await branchExists(input.repository, branch)) ? await resolveCommit(input.repository, branch) : undefined;
      await sandboxes.destroy({ repository: input.repository, root: localSandboxRoot(input.repository, input.objectiveId, MERGER_SANDBOX_NAME) });
      // On Slipway's clone of a remote repository the result goes back to the remote (never forced).
      const remote = integrationHead ? await mirroredRemote(input.repository) : undefined;
      if (!remote) return { integrationHead };
      const spec = classifyRepositorySpec(remote);
      const pushed = await pushToRemote(input.repository, spec.kind === 'url' ? spec.protocol : 'file', branch);
      return pushed.error ? { integrationHead, pushError: `${branch} was not pushed to ${remote}: ${pushed.error}` } : { integrationHead, pushedTo: remote };
    },
  };
  // Git and sandbox plumbing runs under a heartbeat timeout (workflows/activity-options.ts):
  // each of these heartbeats while it works, so a slow one is not retried while it still runs
  // (two git processes on one index), and a dead worker is noticed within that timeout.
  return {
    ...activities,
    prepareObjective: heartbeating(activities.prepareObjective),
    prepareMerger: heartbeating(activities.prepareMerger),
    destroySandbox: heartbeating(activities.destroySandbox),
    commitWork: heartbeating(activities.commitWork),
    mergeStream: heartbeating(activities.mergeStream),
    mergeWithGates: heartbeating(activities.mergeWithGates),
    mergeBatch: heartbeating(activities.mergeBatch),
    resetIntegration: heartbeating(activities.resetIntegration),
    resetOntoIntegration: heartbeating(activities.resetOntoIntegration),
    finishObjective: heartbeating(activities.finishObjective),
  };
}

/** The workflow run preparing an objective (outside an activity: this process). */
function objectiveClaimOwner(): string {
  let execution: { workflowId: string; runId: string } | undefined;
  try {
    execution = Context.current().info.workflowExecution;
  } catch {
    /* not in an activity */
  }
  return execution ? `${execution.workflowId} ${execution.runId}` : `process ${process.pid}`;
}

/**
 * Git in the merger worktree, addressed through the repository's record of it (never its own
 * `.git` file, which post-merge gates could rewrite), with the hardened options of every call.
 */
async function mergerGit(mergerPath: string) {
  const parsed = parseSandboxRoot(path.resolve(mergerPath));
  if (!parsed) throw failure('sandbox_failure', `${mergerPath} is not a Slipway merger worktree`);
  const loc = await locateWorktree(parsed.repository, mergerPath);
  // A worker killed mid-merge leaves git's locks behind; without this every retry fails.
  await clearStaleGitLocks({ top: [loc.adminDir], tree: [path.join(loc.commonDir, 'refs', 'heads', BRANCH_PREFIX, parsed.group)] });
  const pre = trustedWorktreeArgs(loc);
  const identity = await commitIdentityVariables(parsed.repository);
  const files: string[] = [];
  const run = async (args: string[], withIdentity = false) => (await rawGit(loc.worktree, [...pre, ...args], withIdentity ? identity : undefined)).trim();
  return {
    git: run,
    maybe: (args: string[]) => run(args).catch(() => undefined),
    ok: (args: string[]) => gitAnswer(run(args)),
    /** Long texts (the objective) travel in a file, never in argv. */
    messageFile(message: string): string {
      const file = path.join(os.tmpdir(), `slipway-merge-msg-${process.pid}-${Date.now()}-${files.length}`);
      files.push(file);
      writeFileSync(file, message, { mode: 0o600 });
      return file;
    },
    cleanup: () => Promise.all(files.map((f) => fs.rm(f, { force: true }))).then(() => undefined),
    freshSandboxGit: () => discardSandboxGit(loc.repository, loc.worktree),
  };
}

/**
 * `mergeStream` in a merger whose git is already opened (a batch opens it once). `fresh`: make the
 * merger's private git directory anew after a merge (a batch does it once, before its gates).
 * `clean`: the merger is known clean at `expectedTip` (a batch after its first merge left it so),
 * which saves the git calls that find out.
 */
async function mergeInto(m: MergerGit, input: { branch: string; headCommit: string; message: string; expectedTip?: string }, opts: { fresh: boolean; clean?: boolean } = { fresh: true }): Promise<MergeOutcome> {
  const clean = opts.clean && input.expectedTip !== undefined;
  const head = clean ? input.expectedTip! : await m.git(['rev-parse', 'HEAD']);
  if (input.expectedTip && head !== input.expectedTip && !(await m.ok(['merge-base', '--is-ancestor', input.headCommit, head]))) {
    throw failure('sandbox_failure', `the integration branch is at ${head}, not at ${input.expectedTip} where the merge queue left it: refusing to merge on top of it`);
  }
  if (await m.ok(['merge-base', '--is-ancestor', input.headCommit, head])) {
    // Merged before (a retried activity) only if a merge commit of the integration branch
    // brought it in; a head on the integration branch's own line (a rebuild that changed
    // nothing) brought nothing.
    const firstParents = (await m.git(['rev-list', '--first-parent', head])).split('\n');
    if (firstParents.includes(input.headCommit)) {
      return { status: 'no_changes', summary: `the stream's head ${input.headCommit.slice(0, 10)} brings no change over the integration branch` };
    }
    const previous = (await m.maybe(['rev-parse', 'HEAD^1'])) ?? head;
    const isMergeOfStream = (await m.maybe(['rev-parse', 'HEAD^2'])) === input.headCommit;
    return { status: 'merged', commit: head, previous: isMergeOfStream ? previous : head, alreadyMerged: true };
  }
  if (!clean) {
    // A previous attempt may have died mid-merge.
    await m.maybe(['merge', '--abort']);
    await m.git(['reset', '--hard', '-q', head]);
  }
  try {
    await m.git(['merge', '--no-ff', '--no-edit', '-F', m.messageFile(input.message), input.headCommit], true);
  } catch (e) {
    const files = (await m.maybe(['diff', '--name-only', '--diff-filter=U']))?.split('\n').filter(Boolean) ?? [];
    await m.maybe(['merge', '--abort']);
    await m.git(['reset', '--hard', '-q', head]);
    if (files.length === 0) {
      // Not a conflict (git failed for another reason): say what happened.
      throw failure('sandbox_failure', `merging ${input.headCommit} failed: ${tail((e as Error).message, 2000)}`);
    }
    return { status: 'conflict', files, details: tail((e as Error).message, OUTPUT_TAIL_CHARS) };
  } finally {
    await m.cleanup();
  }
  if (await m.ok(['diff', '--quiet', 'HEAD^1', 'HEAD'])) {
    // A merge commit whose tree is the integration branch's: the stream's intent is not in it.
    await m.git(['reset', '--hard', '-q', head]);
    return { status: 'no_changes', summary: `merging ${input.headCommit.slice(0, 10)} changes nothing on the integration branch` };
  }
  // Post-merge gates see the new integration state, from a fresh private git directory.
  if (opts.fresh) await m.freshSandboxGit();
  return { status: 'merged', commit: await m.git(['rev-parse', 'HEAD']), previous: head, alreadyMerged: false };
}

/**
 * A batch attempt killed after some merges leaves them on the integration branch unreported: when
 * the integration branch (at `head`) is `expectedTip` followed, on its first-parent line, only by
 * merge commits of `heads`, they are that attempt's and go (true). Anything else is left for
 * `mergeStream` to judge.
 */
async function unreportedBatch(git: (args: string[]) => Promise<string>, head: string, expectedTip: string, heads: Set<string>): Promise<boolean> {
  if (head === expectedTip || !(await gitAnswer(git(['merge-base', '--is-ancestor', expectedTip, head])))) return false;
  const line = (await git(['rev-list', '--first-parent', '--parents', `${expectedTip}..${head}`])).split('\n').map((l) => l.split(' '));
  return line.every(([, first, second, ...more], i) => second !== undefined && more.length === 0 && heads.has(second) && first === (line[i + 1]?.[0] ?? expectedTip));
}

type MergerGit = Awaited<ReturnType<typeof mergerGit>>;

/** The integration branch's commit and that commit's tree. */
interface IntegrationTip {
  commit: string;
  tree: string;
}

/**
 * The integration branch an objective's merges move, worked on with git's plumbing in the
 * repository's git directory (docs/adr/0033): nothing is checked out for a merge, so no stream's
 * `.gitattributes` (or any file it brought) is seen by the host's git, and an objective whose
 * merger has only git to do has no merger worktree at all. The ref is the merger worktree's branch
 * where there is one, else the objective's integration branch; that worktree follows the ref
 * (`follow`) for the post-merge gates, objective gates and planner that run in it.
 */
async function integrationGit(mergerPath: string) {
  const parsed = parseSandboxRoot(path.resolve(mergerPath));
  if (!parsed) throw failure('sandbox_failure', `${mergerPath} is not a Slipway merger worktree`);
  const loc = await locateWorktree(parsed.repository, mergerPath).catch(async (e: Error) => {
    // A folder there that the repository has no record of is refused, as before; no folder is no worktree.
    if (await fs.stat(mergerPath).then(() => true, () => false)) throw e;
    return undefined;
  });
  const commonDir = loc?.commonDir ?? (await commonDirOf(await fs.realpath(parsed.repository)));
  let ref = `refs/heads/${integrationBranch(parsed.group)}`;
  if (loc) {
    const head = (await fs.readFile(path.join(loc.adminDir, 'HEAD'), 'utf8')).trim();
    if (!head.startsWith('ref: refs/heads/')) throw failure('sandbox_failure', `the merger worktree ${mergerPath} is not on a branch`);
    ref = head.slice('ref: '.length);
  }
  // A worker killed mid-merge leaves git's locks behind; without this every retry fails.
  await clearStaleGitLocks({ top: loc ? [loc.adminDir] : [], tree: [path.join(commonDir, 'refs', 'heads', BRANCH_PREFIX, parsed.group)] });
  // Read while the merge runs; only a merge commit needs it.
  const identity = commitIdentityVariables(parsed.repository);
  identity.catch(() => undefined);
  // The git directory named explicitly (also under safe.bareRepository=explicit); no worktree is read.
  const pre = [`--git-dir=${commonDir}`];
  const run = async (args: string[], env?: Record<string, string>) => (await rawGit(commonDir, [...pre, ...args], env)).trim();
  return {
    ref,
    git: (args: string[]) => run(args),
    ok: (args: string[]) => gitAnswer(run(args)),
    async tip(): Promise<IntegrationTip> {
      const [commit, tree] = (await run(['rev-parse', ref, `${ref}^{tree}`])).split('\n');
      return { commit: commit!, tree: tree! };
    },
    mergeTrees: (ours: string, theirs: string) => mergeTrees(commonDir, pre, ours, theirs),
    /** The merge commit of `tree`, the message as `git merge -F` leaves it; the text goes on stdin, never in argv. */
    async commitTree(tree: string, parents: string[], message: string): Promise<string> {
      return (await rawGitWithInput(commonDir, [...pre, 'commit-tree', tree, ...parents.flatMap((p) => ['-p', p])], stripspace(message), await identity)).trim();
    },
    /**
     * The merger worktree, where there is one, brought to `commit` (the ref's commit): only the
     * files that differ are written. `fresh`: its private git directory made anew for the gates;
     * `clean`: untracked files (the gates' leftovers) go too.
     */
    async follow(commit: string, fresh = true, clean = false): Promise<void> {
      if (!loc) return;
      const wt = (args: string[]) => rawGit(loc.worktree, [...trustedWorktreeArgs(loc), ...args]);
      await wt(['reset', '--hard', '-q', commit]);
      if (clean) await wt(['clean', '-fdq']);
      if (fresh) await discardSandboxGit(loc.repository, loc.worktree);
    },
  };
}

type IntegrationGit = Awaited<ReturnType<typeof integrationGit>>;

/** `mergeAndTip` for one merge. */
async function mergeByPlumbing(g: IntegrationGit, input: { branch: string; headCommit: string; message: string; expectedTip?: string }, opts: { follow: boolean }): Promise<MergeOutcome> {
  return (await mergeAndTip(g, input, opts))[0];
}

/**
 * `mergeStream` by plumbing (docs/adr/0033): `merge-tree --write-tree` of the integration tip and
 * the stream's head, `commit-tree` with the tip as first parent and the head as second, then a
 * compare-and-swap `update-ref` from the tip it merged onto. Outcomes as `mergeInto`'s: a conflict
 * lists its files (nothing to abort: nothing was written), a merge whose tree is the tip's is no
 * merge, one found again (a retried attempt) is `alreadyMerged`. `known`: the tip as the merge
 * before left it (a batch), saving the read. Returns the tip after it when it is known.
 */
async function mergeAndTip(
  g: IntegrationGit,
  input: { branch: string; headCommit: string; message: string; expectedTip?: string },
  opts: { follow: boolean; known?: IntegrationTip },
): Promise<[MergeOutcome, IntegrationTip | undefined]> {
  const treeMerge = (ours: string) =>
    g.mergeTrees(ours, input.headCommit).catch((e: Error) => {
      // Not a conflict (git failed for another reason): say what happened.
      throw failure('sandbox_failure', `merging ${input.headCommit} failed: ${tail(e.message, 2000)}`);
    });
  // The merge onto the tip the queue expects runs while the tip is read; used only if it is the tip.
  const early = !opts.known && input.expectedTip ? treeMerge(input.expectedTip) : undefined;
  early?.catch(() => undefined);
  const tip = opts.known ?? (await g.tip());
  const head = tip.commit;
  if (input.expectedTip && head !== input.expectedTip && !(await g.ok(['merge-base', '--is-ancestor', input.headCommit, head]))) {
    throw failure('sandbox_failure', `the integration branch is at ${head}, not at ${input.expectedTip} where the merge queue left it: refusing to merge on top of it`);
  }
  const merged = await (early && head === input.expectedTip ? early : treeMerge(head));
  if (!merged.clean) return [{ status: 'conflict', files: merged.files, details: tail(merged.details, OUTPUT_TAIL_CHARS) }, tip];
  if (merged.tree === tip.tree) {
    if (await g.ok(['merge-base', '--is-ancestor', input.headCommit, head])) {
      // Merged before (a retried activity) only if a merge commit of the integration branch
      // brought it in; a head on the integration branch's own line (a rebuild that changed
      // nothing) brought nothing.
      const firstParents = (await g.git(['rev-list', '--first-parent', head])).split('\n');
      if (firstParents.includes(input.headCommit)) {
        return [{ status: 'no_changes', summary: `the stream's head ${input.headCommit.slice(0, 10)} brings no change over the integration branch` }, tip];
      }
      const [previous, second] = (await g.git(['rev-list', '--no-walk', '--parents', head])).split(' ').slice(1);
      // The killed attempt may have moved the ref but not the worktree.
      if (opts.follow) await g.follow(head);
      return [{ status: 'merged', commit: head, previous: second === input.headCommit ? previous! : head, alreadyMerged: true }, tip];
    }
    // A merge commit whose tree is the integration branch's: the stream's intent is not in it.
    return [{ status: 'no_changes', summary: `merging ${input.headCommit.slice(0, 10)} changes nothing on the integration branch` }, tip];
  }
  const commit = await g.commitTree(merged.tree, [head, input.headCommit], input.message);
  // Only from the tip merged onto: a branch moved meanwhile fails this, and nothing is lost.
  await g.git(['update-ref', '-m', `slipway: merge ${input.branch}`, g.ref, commit, head]);
  // Post-merge gates see the new integration state, from a fresh private git directory.
  if (opts.follow) await g.follow(commit);
  return [{ status: 'merged', commit, previous: head, alreadyMerged: false }, { commit, tree: merged.tree }];
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
