/**
 * Janitor workflow: one sweep, started every 5 minutes by a Temporal Schedule
 * (`slipway schedules install`). For each repository Slipway worked in, it prunes git's stale
 * worktree records and removes the worktrees and stream branches of objectives that have ended.
 * Whether an objective still runs is asked of Temporal by an activity (a workflow cannot list
 * or describe other workflows); nothing of a running objective is ever removed.
 */
import { log, proxyActivities, setCurrentDetails, upsertSearchAttributes } from '@temporalio/workflow';
import type { JanitorActivities, JanitorInput, RepositorySweep } from '../activities/sandbox/janitor';
import { SlipwayKind } from '../core/search-attributes';

export interface JanitorReport {
  repositories: RepositorySweep[];
  removedWorktrees: number;
  removedBranches: number;
  keptBranches: number;
  errors: string[];
}

const acts = proxyActivities<JanitorActivities>({
  startToCloseTimeout: '10 minutes',
  heartbeatTimeout: '1 minute',
  retry: { maximumAttempts: 3, initialInterval: '5 seconds' },
});

export async function janitorWorkflow(input: JanitorInput = {}): Promise<JanitorReport> {
  upsertSearchAttributes([{ key: SlipwayKind, value: 'janitor' }]);
  const repositories = await acts.janitorRepositories(input);
  setCurrentDetails(`sweeping ${repositories.length} repositories`);
  const report: JanitorReport = { repositories: [], removedWorktrees: 0, removedBranches: 0, keptBranches: 0, errors: [] };
  for (const repository of repositories) {
    try {
      const sweep = await acts.janitorSweepRepository({ repository, keepUnmergedForMs: input.keepUnmergedForMs, registry: input.registry, keepTrashForMs: input.keepTrashForMs });
      report.repositories.push(sweep);
      for (const o of sweep.objectives) {
        report.removedWorktrees += o.removedWorktrees.length;
        report.removedBranches += o.removedBranches.length;
        report.keptBranches += o.keptBranches.length;
      }
      report.errors.push(...sweep.errors.map((e) => `${repository}: ${e}`));
    } catch (e) {
      // One broken repository does not stop the sweep of the others.
      report.errors.push(`${repository}: ${e instanceof Error ? e.message : String(e)}`);
      log.warn('janitor could not sweep a repository', { repository, error: String(e) });
    }
  }
  setCurrentDetails(
    `swept ${repositories.length} repositories: removed ${report.removedWorktrees} worktrees and ${report.removedBranches} branches, ` +
      `kept ${report.keptBranches} unmerged branches${report.errors.length ? `; ${report.errors.length} errors` : ''}`,
  );
  return report;
}
