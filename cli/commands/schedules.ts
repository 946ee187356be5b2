/**
 * `slipway schedules install|list|remove`: the janitor's Temporal Schedule (every 5 minutes it
 * starts `janitorWorkflow` on this task queue). Install is idempotent: an existing schedule is
 * updated to the wanted spec and action instead of duplicated.
 */
import type { Command } from 'commander';
import type { ScheduleOptionsStartWorkflowAction } from '@temporalio/client';
import type { JanitorInput } from '../../activities/sandbox/janitor';
import { DEFAULT_TASK_QUEUE, JANITOR_INTERVAL_MS, JANITOR_SCHEDULE_ID, JANITOR_WORKFLOW_ID } from '../../core/ids';
import type { janitorWorkflow } from '../../workflows/janitor';
import { CliError, EXIT } from '../exit-codes';
import { GROUP_DESCRIPTIONS } from '../verbs';
import { openRuntime } from '../runtime';

// Loaded on use: `slipway schedules --help` need not load the Temporal SDK (ADR 0016, 3).
const sdk = () => require('@temporalio/client') as typeof import('@temporalio/client');

/** One janitor schedule per task queue: `slipway-janitor`, or `slipway-janitor-<queue>` for other queues. */
export const janitorScheduleId = (taskQueue: string) => (taskQueue === DEFAULT_TASK_QUEUE ? JANITOR_SCHEDULE_ID : `${JANITOR_SCHEDULE_ID}-${taskQueue}`);

function parseInterval(value: string | undefined): number {
  if (value === undefined) return JANITOR_INTERVAL_MS;
  const m = /^(\d+)(s|m|h)$/.exec(value.trim());
  if (!m) throw new CliError(`--every must look like 30s, 5m or 1h, got "${value}"`);
  const ms = Number(m[1]) * { s: 1_000, m: 60_000, h: 3_600_000 }[m[2] as 's' | 'm' | 'h'];
  if (ms < 10_000) throw new CliError('--every must be at least 10s');
  return ms;
}

export async function schedulesInstallCommand(opts: { every?: string; json?: boolean }): Promise<number> {
  const every = parseInterval(opts.every);
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const { client, settings } = runtime;
    const scheduleId = janitorScheduleId(settings.taskQueue);
    const spec = { intervals: [{ every }] };
    const action: ScheduleOptionsStartWorkflowAction<typeof janitorWorkflow> = {
      type: 'startWorkflow',
      workflowType: 'janitorWorkflow',
      workflowId: `${JANITOR_WORKFLOW_ID}:${settings.taskQueue}`,
      taskQueue: settings.taskQueue,
      args: [{} satisfies JanitorInput],
      typedSearchAttributes: [{ key: (require('../../core/search-attributes') as typeof import('../../core/search-attributes')).SlipwayKind, value: 'janitor' }],
      staticSummary: 'Slipway janitor: remove worktrees and branches of ended objectives',
    };
    let created = false;
    try {
      await client.schedule.create({
        scheduleId,
        spec,
        action,
        policies: { overlap: sdk().ScheduleOverlapPolicy.SKIP, catchupWindow: '1 minute' },
        memo: { slipway: 'janitor' },
      });
      created = true;
    } catch (e) {
      if (!(e instanceof sdk().ScheduleAlreadyRunning)) throw e;
      await client.schedule.getHandle(scheduleId).update((previous) => ({
        ...previous,
        spec,
        action,
        policies: { ...previous.policies, overlap: sdk().ScheduleOverlapPolicy.SKIP },
      }));
    }
    const line = `${created ? 'installed' : 'updated'} schedule ${scheduleId}: janitorWorkflow every ${every / 1000} s on task queue "${settings.taskQueue}"`;
    if (opts.json) process.stdout.write(`${JSON.stringify({ scheduleId, created, everyMs: every, taskQueue: settings.taskQueue })}\n`);
    else process.stdout.write(`${line}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

export async function schedulesListCommand(opts: { json?: boolean }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const rows: Array<{ scheduleId: string; workflowType?: string; paused: boolean; next?: string; recent?: string }> = [];
    for await (const s of runtime.client.schedule.list()) {
      if (!s.scheduleId.startsWith('slipway-')) continue;
      rows.push({
        scheduleId: s.scheduleId,
        workflowType: s.action?.type === 'startWorkflow' ? s.action.workflowType : undefined,
        paused: s.state.paused,
        next: s.info.nextActionTimes[0]?.toISOString(),
        recent: s.info.recentActions.at(-1)?.takenAt.toISOString(),
      });
    }
    if (opts.json) process.stdout.write(`${JSON.stringify(rows)}\n`);
    else if (rows.length === 0) process.stdout.write('no Slipway schedules (install the janitor with `slipway schedules install`)\n');
    else for (const r of rows) process.stdout.write(`${r.scheduleId.padEnd(32)} ${String(r.workflowType).padEnd(24)} ${r.paused ? 'paused' : `next ${r.next ?? '-'}`}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

export async function schedulesRemoveCommand(): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const scheduleId = janitorScheduleId(runtime.settings.taskQueue);
    try {
      await runtime.client.schedule.getHandle(scheduleId).delete();
    } catch (e) {
      if (e instanceof sdk().ScheduleNotFoundError) throw new CliError(`no schedule ${scheduleId}`, EXIT.badInput);
      throw e;
    }
    process.stdout.write(`removed schedule ${scheduleId}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

/** `slipway schedules ...` */
export function registerSchedulesCommands(program: Command, setExit: (code: number) => void): void {
  const schedules = program.command('schedules').description(GROUP_DESCRIPTIONS.schedules);
  schedules
    .command('install')
    .description('install (or update) the janitor schedule: every 5 minutes, remove worktrees and branches of ended objectives')
    .option('--every <interval>', 'how often, e.g. 5m, 30s, 1h', '5m')
    .option('--json', 'print JSON')
    .action(async (opts) => setExit(await schedulesInstallCommand(opts)));
  schedules
    .command('list')
    .description("list Slipway's schedules")
    .option('--json', 'print JSON')
    .action(async (opts) => setExit(await schedulesListCommand(opts)));
  schedules
    .command('remove')
    .description('remove the janitor schedule of this task queue')
    .action(async () => setExit(await schedulesRemoveCommand()));
}
