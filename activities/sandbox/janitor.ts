/**
 * The janitor's activities: for every repository in the registry (registry.ts), prune git's
 * stale worktree records, remove the worktrees and `slipway/<objective>/<stream>` branches of
 * objectives that have ended (asking Temporal, through a Client, whether `objective:<id>` still
 * runs), and tidy the warm pool, old templates and the trash.
 *
 * Never removed: anything of an objective that is still running (or whose state Temporal cannot
 * tell, or that runs on another Temporal cluster or namespace); an ended objective's integration
 * branch (its result); an ended objective's stream branch holding commits its integration branch
 * lacks, until `keepUnmergedForMs` after the end (after registration, when Temporal no longer
 * knows the objective). Removed branches go to the trash refs, not away.
 */
import { objectiveSessionsDir } from '../agents/session-carry';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { Context } from '@temporalio/activity';
import { WorkflowNotFoundError, type Client } from '@temporalio/client';
import { BRANCH_PREFIX, MERGER_SANDBOX_NAME, integrationBranch, objectiveWorkflowId, SLIPWAY_DIR, streamWorkflowId, WORKTREES_DIR } from '../../core/ids';
import { expireTrash, gitMaybe, GitError, isAncestor, listWorktrees, rawGit, trashBranch } from '../../lib/git';
import { DAYTONA_DIR, DaytonaSandboxProvider } from './daytona';
import { KUBERNETES_DIR, KubernetesSandboxProvider } from './kubernetes';
import { LocalSandboxProvider } from './local';
import { sweepPool, type PoolSweepResult } from './pool';
import { forgetObjective, forgetRepository, readRegistry, registryPath, type RegistryObjective, type TemporalHome } from './registry';
import { removeOldTemplates } from './template';
import { DISKS_DIR } from './disk';

export { JANITOR_INTERVAL_MS, JANITOR_SCHEDULE_ID, JANITOR_WORKFLOW_ID } from '../../core/ids';
/** Default: unmerged stream branches of an ended objective stay a day, for `slipway worktree review|merge`. */
export const DEFAULT_KEEP_UNMERGED_MS = 24 * 3600_000;
/** Branches the janitor removed stay in the trash refs this long (lib/git.ts `trashBranch`). */
export const DEFAULT_KEEP_TRASH_MS = 14 * 24 * 3600_000;
/** Warm-pool entries nobody claimed for this long are removed (their base has most likely moved on). */
export const POOL_ENTRY_MAX_AGE_MS = 7 * 24 * 3600_000;
/** Branch folders under `slipway/` the sandbox service uses; an objective of that name is never swept. */
const SERVICE_BRANCH_GROUPS = ['sandboxes', 'warm'] as const;

export interface JanitorInput {
  /** Only these repositories (default: every repository in the registry). */
  repositories?: string[];
  /** How long after its objective ended a stream branch with unmerged commits is kept (default 24 h). */
  keepUnmergedForMs?: number;
  /** The registry file (default `$SLIPWAY_HOME/repositories.json`). */
  registry?: string;
  /** How long removed branches stay in the trash refs (default 14 days). */
  keepTrashForMs?: number;
}

export type ObjectiveLiveness =
  | { state: 'running' }
  | { state: 'ended'; status: string; closedAt?: string }
  | { state: 'unknown'; reason: string };

export interface ObjectiveSweep {
  id: string;
  liveness: ObjectiveLiveness;
  removedWorktrees: string[];
  removedBranches: string[];
  keptBranches: Array<{ branch: string; reason: string }>;
  forgotten: boolean;
}

export interface RepositorySweep {
  repository: string;
  missing: boolean;
  objectives: ObjectiveSweep[];
  pool?: PoolSweepResult;
  templatesRemoved: string[];
  trashRemoved: number;
  /** Trash refs (removed branches) past their keep time, deleted. */
  trashRefsExpired?: number;
  /** Kubernetes pods and claims with Slipway's labels that no record named, deleted (`<namespace>/<resource>/<name>`). */
  kubernetesOrphans?: string[];
  errors: string[];
}

export interface JanitorActivityDeps {
  client: Client;
  /** This janitor's Temporal cluster and namespace (default: asked of `client`). */
  temporalHome?: () => Promise<TemporalHome>;
  /** Provider used to remove worktrees (default: an unconfined local provider). */
  sandboxes?: LocalSandboxProvider;
  /** Removes an ended objective's Daytona sandboxes (default: one from the worker's DAYTONA_* variables, made only when an objective has some). */
  daytona?: DaytonaSandboxProvider;
  /** Removes an ended objective's pods and orphaned pods and claims (default: one from the worker's KUBECONFIG, made only in repositories that had Kubernetes sandboxes). */
  kubernetes?: KubernetesSandboxProvider;
  /** How old an unrecorded pod or claim must be before it is an orphan (default 10 minutes: a create in flight records it first). */
  kubernetesOrphanGraceMs?: number;
}

/**
 * The cluster (its id, which survives restarts of a server on the same store) and namespace a
 * client talks to; asked once, again after a failure.
 */
export function temporalHomeOf(client: Client): () => Promise<TemporalHome> {
  let home: Promise<TemporalHome> | undefined;
  return () => {
    home ??= client.workflowService.getClusterInfo({}).then((info) => {
      if (!info.clusterId) throw new Error('the Temporal server reported no cluster id');
      return { cluster: info.clusterId, namespace: client.options.namespace };
    });
    home.catch(() => {
      home = undefined;
    });
    return home;
  };
}

/** Asks Temporal whether `objective:<id>` still runs. */
export async function objectiveLiveness(client: Client, id: string): Promise<ObjectiveLiveness> {
  try {
    const description = await client.workflow.getHandle(objectiveWorkflowId(id)).describe();
    if (description.status.name === 'RUNNING') return { state: 'running' };
    return { state: 'ended', status: description.status.name.toLowerCase(), closedAt: description.closeTime?.toISOString() };
  } catch (e) {
    if (e instanceof WorkflowNotFoundError) return { state: 'ended', status: 'not_found' };
    return { state: 'unknown', reason: (e as Error).message };
  }
}

/**
 * Worktrees of a running objective's streams that were terminated by hand or timed out: such a
 * stream never ran its cleanup, and it owns its sandbox (no sandbox workflow outlives it, ADR
 * 0032). Only those two ends: a stream that completed, failed or was cancelled removed its own,
 * and one Temporal does not know (yet) is left alone. The branch stays for the objective's end.
 */
async function sweepAbandonedStreams(repo: string, id: string, client: Client, sandboxes: LocalSandboxProvider): Promise<string[]> {
  const removed: string[] = [];
  const groupDir = path.join(repo, WORKTREES_DIR, id);
  for (const name of await fs.readdir(groupDir).catch(() => [] as string[])) {
    if (name === MERGER_SANDBOX_NAME) continue;
    // Asked right before the removal, as for the objective.
    const status = await client.workflow
      .getHandle(streamWorkflowId(id, name))
      .describe()
      .then((d) => d.status.name)
      .catch(() => undefined);
    if (status !== 'TERMINATED' && status !== 'TIMED_OUT') continue;
    await sandboxes.destroy({ repository: repo, root: path.join(groupDir, name) });
    removed.push(path.join(groupDir, name));
  }
  return removed;
}

async function branchesOf(repo: string, objectiveId: string): Promise<Array<{ branch: string; commit: string }>> {
  const out = await rawGit(repo, ['for-each-ref', '--format=%(refname:short) %(objectname)', `refs/heads/${BRANCH_PREFIX}/${objectiveId}/`]);
  return out
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const [branch, commit] = line.split(' ');
      return { branch, commit };
    });
}

async function sweepObjective(
  repo: string,
  id: string,
  entry: RegistryObjective,
  client: Client,
  mine: TemporalHome | undefined,
  sandboxes: LocalSandboxProvider,
  keepUnmergedForMs: number,
  registry: string,
  daytona: () => DaytonaSandboxProvider,
  kubernetes: () => KubernetesSandboxProvider,
): Promise<ObjectiveSweep> {
  const result: ObjectiveSweep = { id, liveness: { state: 'unknown', reason: 'not asked' }, removedWorktrees: [], removedBranches: [], keptBranches: [], forgotten: false };
  if ((SERVICE_BRANCH_GROUPS as readonly string[]).includes(id)) {
    // `slipway/sandboxes/*` and `slipway/warm/*` belong to the sandbox service.
    result.liveness = { state: 'unknown', reason: `"${id}" names the sandbox service's branches; not swept` };
    return result;
  }
  if (entry.temporal && !mine) {
    result.liveness = { state: 'unknown', reason: "could not ask Temporal which cluster this janitor serves" };
    return result;
  }
  if (entry.temporal && mine && (entry.temporal.cluster !== mine.cluster || entry.temporal.namespace !== mine.namespace)) {
    // Another server's (or namespace's) objective: this janitor cannot tell whether it runs.
    result.liveness = { state: 'unknown', reason: `runs on Temporal cluster ${entry.temporal.cluster}, namespace ${entry.temporal.namespace}; not this janitor's` };
    return result;
  }
  // Asked right before anything is removed, so a just-started objective is never swept.
  result.liveness = await objectiveLiveness(client, id);
  if (result.liveness.state === 'running') {
    result.removedWorktrees.push(...(await sweepAbandonedStreams(repo, id, client, sandboxes)));
    return result;
  }
  if (result.liveness.state !== 'ended') return result;
  if (result.liveness.status === 'not_found') {
    if (!entry.temporal) {
      result.liveness = { state: 'unknown', reason: 'not found here, and registered without its Temporal cluster: it may run on another server' };
      return result;
    }
    if (Date.now() - Date.parse(entry.addedAt) < 60_000) {
      // Registered a moment ago: its workflow may not be visible yet.
      result.liveness = { state: 'unknown', reason: 'registered less than a minute ago and not found yet' };
      return result;
    }
  }
  // When Temporal no longer knows when it ended (not found, retention), the grace period counts
  // from registration, never from the epoch.
  const endedAt = result.liveness.closedAt ? Date.parse(result.liveness.closedAt) : Date.parse(entry.addedAt);

  // 1. Worktrees of the objective (streams, merger), and git's records of any of its branches checked out elsewhere under .slipway.
  const groupDir = path.join(repo, WORKTREES_DIR, id);
  const worktrees = await listWorktrees(repo);
  const ours = worktrees.filter((w) => !w.prunable && (w.path.startsWith(groupDir + path.sep) || (w.branch?.startsWith(`${BRANCH_PREFIX}/${id}/`) && w.path.startsWith(path.join(repo, SLIPWAY_DIR) + path.sep))));
  for (const w of ours) {
    await sandboxes.destroy({ repository: repo, root: w.path });
    result.removedWorktrees.push(w.path);
  }
  for (const name of await fs.readdir(groupDir).catch(() => [] as string[])) {
    // Folders git no longer knows (a crash between rm and prune).
    await sandboxes.destroy({ repository: repo, root: path.join(groupDir, name) });
    result.removedWorktrees.push(path.join(groupDir, name));
  }
  // Its Daytona sandboxes (ADR 0019), by label, where Slipway recorded some: no call to Daytona otherwise.
  if (existsSync(path.join(repo, DAYTONA_DIR, id))) result.removedWorktrees.push(...(await daytona().sweepGroup(repo, id)));
  // Its pods and claims (ADR 0020), by label, likewise.
  if (existsSync(path.join(repo, KUBERNETES_DIR, id))) result.removedWorktrees.push(...(await kubernetes().sweepGroup(repo, id)));
  await fs.rm(path.join(repo, SLIPWAY_DIR, 'sandboxes', id), { recursive: true, force: true });
  await fs.rm(objectiveSessionsDir(repo, id), { recursive: true, force: true });
  // Disk images whose sandbox is gone (destroy unmounts and deletes its own; a crash between the two leaves one).
  await fs.rm(path.join(repo, DISKS_DIR, id), { recursive: true, force: true });
  await fs.rmdir(groupDir).catch(() => undefined);

  // 2. Stream branches: merged ones (or ones without work) go now, unmerged ones after the grace period.
  const integration = integrationBranch(id);
  const branches = await branchesOf(repo, id);
  const integrationHead = branches.find((b) => b.branch === integration)?.commit;
  for (const { branch, commit } of branches) {
    if (branch === integration) continue;
    const noWork = entry.baseCommit !== undefined && commit === entry.baseCommit;
    const merged = noWork || (integrationHead !== undefined && (await isAncestor(repo, commit, integrationHead)));
    if (!merged && Date.now() - endedAt < keepUnmergedForMs) {
      result.keptBranches.push({ branch, reason: `holds commits not on ${integration}; kept until ${new Date(endedAt + keepUnmergedForMs).toISOString()}` });
      continue;
    }
    const trashed = await trashBranch(repo, branch, commit).catch((e: Error) => e);
    if (typeof trashed === 'string') result.removedBranches.push(branch);
    else result.keptBranches.push({ branch, reason: `could not move it to the trash: ${trashed.message}` });
  }
  if (result.keptBranches.length === 0) {
    await forgetObjective(repo, id, registry);
    result.forgotten = true;
  }
  return result;
}

export function createJanitorActivities(deps: JanitorActivityDeps) {
  const sandboxes = deps.sandboxes ?? new LocalSandboxProvider({ copyIgnored: false });
  let daytona = deps.daytona;
  const daytonaProvider = () => (daytona ??= new DaytonaSandboxProvider());
  let kubernetes = deps.kubernetes;
  const kubernetesProvider = () => (kubernetes ??= new KubernetesSandboxProvider());
  const home = deps.temporalHome ?? temporalHomeOf(deps.client);
  return {
    /** The repositories to sweep: the registry's, or the ones asked for. */
    async janitorRepositories(input: JanitorInput): Promise<string[]> {
      const registry = await readRegistry(input.registry ?? registryPath());
      const known = Object.keys(registry.repositories).sort();
      return input.repositories ? known.filter((r) => input.repositories!.includes(r)) : known;
    },

    /** Sweeps one repository. Idempotent; removes nothing of a running objective. */
    async janitorSweepRepository(input: { repository: string } & Pick<JanitorInput, 'keepUnmergedForMs' | 'registry' | 'keepTrashForMs'>): Promise<RepositorySweep> {
      const repo = input.repository;
      const registryFile = input.registry ?? registryPath();
      const result: RepositorySweep = { repository: repo, missing: false, objectives: [], templatesRemoved: [], trashRemoved: 0, errors: [] };
      // Forgotten only when it is gone or no repository any more (git's 128), not when git failed otherwise (killed, out of time).
      const gone = !existsSync(repo) || (await rawGit(repo, ['rev-parse', '--git-dir']).then(() => false, (e: unknown) => (e instanceof GitError && e.exitCode === 128 ? true : Promise.reject(e))));
      if (gone) {
        result.missing = true;
        await forgetRepository(repo, registryFile);
        return result;
      }
      const heartbeat = (details: unknown) => {
        try {
          Context.current().heartbeat(details);
        } catch {
          /* not in an activity */
        }
      };
      await gitMaybe(repo, ['worktree', 'prune']);
      const registry = await readRegistry(registryFile);
      const objectives = registry.repositories[repo]?.objectives ?? {};
      const mine = await home().catch(() => undefined);
      for (const [id, entry] of Object.entries(objectives)) {
        heartbeat({ objective: id });
        try {
          result.objectives.push(await sweepObjective(repo, id, entry, deps.client, mine, sandboxes, input.keepUnmergedForMs ?? DEFAULT_KEEP_UNMERGED_MS, registryFile, daytonaProvider, kubernetesProvider));
        } catch (e) {
          result.errors.push(`${id}: ${(e as Error).message}`);
        }
      }
      if (existsSync(path.join(repo, KUBERNETES_DIR))) {
        // Pods and claims no record names (ADR 0029): only where Slipway made Kubernetes sandboxes, so no cluster is asked otherwise.
        heartbeat({ kubernetes: true });
        try {
          result.kubernetesOrphans = await kubernetesProvider().sweepOrphans(repo, { graceMs: deps.kubernetesOrphanGraceMs ?? 10 * 60_000 });
        } catch (e) {
          result.errors.push(`kubernetes: ${(e as Error).message}`);
        }
      }
      heartbeat({ pool: true });
      try {
        result.pool = await sweepPool(repo, undefined, { readyOlderThanMs: POOL_ENTRY_MAX_AGE_MS });
        result.templatesRemoved = await removeOldTemplates(repo);
      } catch (e) {
        result.errors.push(`pool/templates: ${(e as Error).message}`);
      }
      const trash = path.join(repo, SLIPWAY_DIR, 'trash');
      for (const name of await fs.readdir(trash).catch(() => [] as string[])) {
        const stat = await fs.lstat(path.join(trash, name)).catch(() => undefined);
        if (!stat || Date.now() - stat.mtimeMs < 10 * 60_000) continue;
        await fs.rm(path.join(trash, name), { recursive: true, force: true });
        result.trashRemoved++;
      }
      try {
        result.trashRefsExpired = (await expireTrash(repo, input.keepTrashForMs ?? DEFAULT_KEEP_TRASH_MS)).length;
      } catch (e) {
        result.errors.push(`trash refs: ${(e as Error).message}`);
      }
      await gitMaybe(repo, ['worktree', 'prune']);
      return result;
    },
  };
}

export type JanitorActivities = ReturnType<typeof createJanitorActivities>;
