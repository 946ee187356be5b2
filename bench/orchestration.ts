/**
 * Orchestration overhead, with the Temporal server and a worker already up (issue 17). Runs
 * objectives through the client API (no CLI start-up) on a tiny repository with a zero-work
 * agent (it writes and commits one file):
 *
 *   1 stream, no gates          the fixed cost of an objective        (goal: under 0.8 s)
 *   4, 16, 64 streams, gate `true`, all in parallel                   (goal: each added stream
 *                                                                       under 0.25 s wall, 0.3 CPU-s)
 *
 * and side by side in the same run, the floor: the same git operations done by a shell script
 * (worktree add + commit per stream, then a merge per stream in one merger worktree, gate `true`).
 *
 * Per case it prints wall time, CPU-seconds of the Temporal server and the worker processes
 * (their own utime + stime from /proc/<pid>/stat, before and after; what they ran, agents, gates
 * and git, is shown apart as children), merge-ready -> merged per stream (from the stream's
 * histories: its merge-ready signal to the decision it hears), and a breakdown from the
 * histories of the objective and all its children: workflow tasks (count, time from scheduled
 * to started and from started to completed), activities per type (count, run time, and
 * schedule-to-start: the time they waited for a worker slot), child starts. Per case also: the
 * server's CPU per history event and the worker's per workflow task (activities included), the
 * worker's resident memory (each fork of it costs in proportion), the workflow tasks that came
 * on the sticky queue and those that missed the worker's cache (normal queue: a full replay),
 * the histories' bytes with the payload bytes per event type, and the server's work from its
 * Prometheus metrics (SQLite operations and their time per operation, sync and async matches).
 *
 * The reference: Sandcastle (npm @ai-hero/sandcastle 0.12.0, installed on first use into the
 * git-ignored bench/.reference/; `--no-sandcastle` leaves it out) runs the same agent with
 * `noSandbox()` on its own branch per stream, then a script merges the branches with the gate.
 * Its runs go at most 3 at a time (a case that fails anyway is tried again on a fresh
 * repository, up to 3 times, else shown as "-"): more at once fail in Sandcastle itself (each run adds a
 * `safe.directory` to the global git config, and concurrent writers lose on its lock; its
 * `merge-to-head` strategy fails likewise on concurrent merges into the checkout). Its global
 * git config writes go to a temporary file (GIT_CONFIG_GLOBAL), never the user's.
 *
 * Usage: npx tsx bench/orchestration.ts [--quick] [--json] [--rounds N] [--streams 1,4,16,64] [--no-sandcastle] [--against DIR] [--timeline] [--cpu-prof DIR]
 *   --quick    streams 1, 4, 16 and one round
 *   --rounds   rounds per case; the median is printed (default 3, 1 with --quick)
 *   --against  another built checkout (its bin/slipway.cjs and dist/): a second worker of that
 *              code on its own task queue runs every case right before this checkout's, on the
 *              same server, and the ratios this/that are printed (A/B under the same load)
 *   --timeline prints, per case of at most 4 streams, the median round's objective and streams in
 *              time order: each workflow task, activity, signal and child with its wait and run
 *              (what lies on the path from start to result, and where a run waited)
 *   --cpu-prof this checkout's worker runs with `node --cpu-prof` and writes its profile into DIR
 *              when it stops (open it in Chrome DevTools or read it with bench/tools/cpu-profile.ts)
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { Client, Connection } from '@temporalio/client';
import { tsToMs } from '@temporalio/common/lib/time';
import { temporal } from '@temporalio/proto';
import { stringify } from 'yaml';
import { loadObjectiveFile } from '../config/objective-file';
import { objectiveWorkflowId } from '../core/ids';
import type { ObjectiveResult } from '../core/types';
import { slipwaySettings } from '../lib/settings';
import { freePort, startDevServer } from '../workers/dev-server';
import { slipwayDataConverter } from '../workers/payload-codec';
import { objectiveWorkflow } from '../workflows/objective';
import { mergeDecisionSignal, streamEventsSignal, streamMergeReadySignal } from '../workflows/stream';

type HistoryEvent = temporal.api.history.v1.IHistoryEvent;

const argv = process.argv.slice(2);
const quick = argv.includes('--quick');
const asJson = argv.includes('--json');
const option = (name: string) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : undefined;
};
const ROUNDS = Number(option('--rounds') ?? (quick ? 1 : 3));
const STREAMS = (option('--streams') ?? (quick ? '1,4,16' : '1,4,16,64')).split(',').map(Number);
const SANDCASTLE = !argv.includes('--no-sandcastle');
const AGAINST = option('--against');
/** A folder for V8 CPU profiles of this checkout's worker (node --cpu-prof, written when it exits). */
const CPU_PROF = option('--cpu-prof');
const TIMELINE = argv.includes('--timeline');
const SANDCASTLE_VERSION = '0.12.0';
const SANDCASTLE_PARALLEL = 3;
const BIN = path.join(__dirname, '..', 'bin', 'slipway.cjs');
const CLK_TCK = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim());

const log = (line: string) => {
  if (!asJson) process.stderr.write(`${line}\n`);
};
const median = (xs: number[]) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
const sh = (cwd: string, script: string) => execFileSync('sh', ['-ec', script], { cwd, stdio: ['ignore', 'pipe', 'pipe'] });

/** A process's own CPU-seconds and its reaped children's (/proc/<pid>/stat fields 14-17). */
function statCpu(pid: number): { self: number; children: number } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const [utime, stime, cutime, cstime] = fields.slice(11, 15).map(Number);
  return { self: (utime + stime) / CLK_TCK, children: (cutime + cstime) / CLK_TCK };
}

/** The living child processes of a process (every thread's /proc children list). */
function livingChildren(pid: number): number[] {
  const kids: number[] = [];
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      kids.push(...readFileSync(`/proc/${pid}/task/${tid}/children`, 'utf8').split(' ').filter(Boolean).map(Number));
    } catch {
      // the thread ended meanwhile
    }
  }
  return kids;
}

/**
 * CPU-seconds of a process and of what it ran. A long-lived helper it holds (the worker's
 * spawner, ADR 0036) is part of the process itself, and what that helper reaped (host git) is
 * shown with the children: neither reaches the process's own counters before the helper exits.
 */
function cpuOf(pid: number): { self: number; children: number } {
  const own = statCpu(pid);
  for (const kid of livingChildren(pid)) {
    try {
      const k = cpuOf(kid);
      own.self += k.self;
      own.children += k.children;
    } catch {
      // the child ended between the listing and the read: its time is in our reaped children now
    }
  }
  return own;
}

/**
 * A process's resident memory in MB (/proc/<pid>/status VmRSS). The worker's matters beyond
 * memory: every process it spawns (git, gates, agents) forks it, and a fork costs the worker's
 * main thread time in proportion to its resident pages (ADR 0035).
 */
function rssMbOf(pid: number): number {
  const kb = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
  return kb ? Number(kb) / 1024 : NaN;
}

function makeRepo(parent: string): string {
  const repo = path.join(parent, `repo-${randomBytes(3).toString('hex')}`);
  mkdirSync(repo);
  sh(repo, 'git init -q -b main && echo bench > README.md && git add -A && git -c user.name=bench -c user.email=bench@localhost commit -qm init');
  return repo;
}

/**
 * The server's work from its Prometheus metrics: counters summed per metric and operation, e.g.
 * `persistence_requests GetWorkflowExecution`. Diffed around a case, they say what the server
 * spent its CPU on (SQLite writes and reads per operation, tasks matched to a waiting poll or
 * written to the database first) and where a hop waited inside it (`task_latency_load`: a history
 * task written until its queue read it; ADR 0039).
 */
async function serverCounters(metricsUrl: string): Promise<Map<string, number>> {
  const counters = new Map<string, number>();
  const text = await (await fetch(metricsUrl)).text();
  for (const line of text.split('\n')) {
    const m = /^(persistence_requests|persistence_latency_sum|visibility_persistence_requests|visibility_persistence_latency_sum|\w*match\w*_count|service_requests|task_latency_load_sum|task_latency_load_count)\{([^}]*)\} ([\d.e+-]+)$/.exec(line);
    if (!m) continue;
    const operation = /operation="([^"]*)"/.exec(m[2])?.[1] ?? '';
    const key = `${m[1]} ${operation}`;
    counters.set(key, (counters.get(key) ?? 0) + Number(m[3]));
  }
  return counters;
}

function diffCounters(before: Map<string, number>, after: Map<string, number>): Record<string, number> {
  const d: Record<string, number> = {};
  for (const [k, v] of after) if (v - (before.get(k) ?? 0) > 0) d[k] = v - (before.get(k) ?? 0);
  return d;
}

/** The zero-work agent: writes and commits one file. */
const AGENT = 'cat > /dev/null; echo "$SLIPWAY_STREAM" > "out-$SLIPWAY_STREAM.txt"; git add -A; git commit -qm "$SLIPWAY_STREAM"';

function objectiveFile(parent: string, repo: string, streams: number, gates: boolean): string {
  const dir = mkdtempSync(path.join(parent, 'objective-'));
  const file = path.join(dir, 'objective.yaml');
  writeFileSync(
    file,
    stringify({
      objective: `bench ${streams} streams`,
      repository: repo,
      max_parallel_streams: streams,
      ...(gates ? { gates: [{ name: 'true', command: 'true' }] } : {}),
      agents: { builder: { provider: 'script', command: AGENT } },
      streams: Array.from({ length: streams }, (_, i) => ({ id: `s${i + 1}`, task: `file ${i + 1}` })),
    }),
  );
  return file;
}

/** The floor: the same git work by a script, one step after another. */
function floorScript(streams: number, gates: boolean): string {
  const gate = gates ? ' && true' : '';
  return [
    'git worktree add -q -b floor/merger .floor/merger main',
    `for i in $(seq 1 ${streams}); do`,
    '  git worktree add -q -b floor/s$i .floor/s$i main',
    `  (cd .floor/s$i && echo $i > out-$i.txt && git add -A && git -c user.name=b -c user.email=b@b commit -qm s$i${gate})`,
    'done',
    `for i in $(seq 1 ${streams}); do (cd .floor/merger && git -c user.name=b -c user.email=b@b merge -q --no-ff -m "merge s$i" floor/s$i${gate}); done`,
  ].join('\n');
}

// --- the reference: Sandcastle ---------------------------------------------------------------------

type SandcastleRun = (opts: Record<string, unknown>) => Promise<{ commits: unknown[] }>;
interface Sandcastle {
  run: SandcastleRun;
  noSandbox: () => unknown;
}

/** Sandcastle, installed into bench/.reference/ when missing; a reason when it cannot be had. */
async function loadSandcastle(): Promise<Sandcastle | string> {
  const prefix = path.join(__dirname, '.reference');
  const pkg = path.join(prefix, 'node_modules', '@ai-hero', 'sandcastle');
  const installed = () => {
    try {
      return JSON.parse(readFileSync(path.join(pkg, 'package.json'), 'utf8')).version === SANDCASTLE_VERSION;
    } catch {
      return false;
    }
  };
  if (!installed()) {
    log(`installing @ai-hero/sandcastle@${SANDCASTLE_VERSION} into ${prefix}`);
    try {
      mkdirSync(prefix, { recursive: true });
      execFileSync('npm', ['install', '--no-save', '--no-audit', '--no-fund', '--prefix', prefix, `@ai-hero/sandcastle@${SANDCASTLE_VERSION}`], { stdio: 'ignore', timeout: 120_000 });
    } catch (e) {
      return `npm install failed or took over 2 minutes: ${(e as Error).message.split('\n')[0]}`;
    }
  }
  // A real dynamic import (Sandcastle is ESM only; tsx would turn `import()` into `require`).
  const esm = new Function('url', 'return import(url)') as (url: string) => Promise<Record<string, unknown>>;
  const main = await esm(pathToFileURL(path.join(pkg, 'dist', 'index.js')).href);
  const none = await esm(pathToFileURL(path.join(pkg, 'dist', 'sandboxes', 'no-sandbox.js')).href);
  return { run: main.run as SandcastleRun, noSandbox: none.noSandbox as () => unknown };
}

/** The same objective through Sandcastle: a run per stream on its own branch, then merges by a script. */
async function sandcastleObjective(sc: Sandcastle, repo: string, streams: number, gates: boolean): Promise<number> {
  const agent = (i: number) => ({
    name: 'zero-work',
    env: {},
    captureSessions: false,
    buildPrintCommand: () => ({ command: `sh -c 'echo s${i} > out-s${i}.txt && git add -A && git -c user.name=b -c user.email=b@b commit -qm s${i}'` }),
    parseStreamLine: () => [],
  });
  const t0 = performance.now();
  let next = 1;
  const lane = async () => {
    for (let i = next++; i <= streams; i = next++) {
      const r = await sc.run({ agent: agent(i), sandbox: sc.noSandbox(), branchStrategy: { type: 'branch', branch: `sc/s${i}` }, cwd: repo, prompt: 'zero work', name: `s${i}`, logging: { type: 'file', path: path.join(repo, '..', `sc-${path.basename(repo)}-${i}.log`) } });
      if (r.commits.length !== 1) throw new Error(`sandcastle run s${i} made ${r.commits.length} commits`);
    }
  };
  await Promise.all(Array.from({ length: Math.min(SANDCASTLE_PARALLEL, streams) }, lane));
  const gate = gates ? ' && true' : '';
  sh(repo, `for i in $(seq 1 ${streams}); do git -c user.name=b -c user.email=b@b merge -q --no-ff -m "merge s$i" sc/s$i${gate}; done`);
  return performance.now() - t0;
}

// --- histories ----------------------------------------------------------------------------------

interface Run {
  workflowId: string;
  type: string;
  events: HistoryEvent[];
}

const ms = (e: HistoryEvent) => tsToMs(e.eventTime!);
/** The activity a merge starts with: merge, gates and revert in one (patch one-activity-merge), or the merge alone. */
const MERGE_ACTIVITIES = ['mergeBatch', 'mergeWithGates', 'mergeStream'];

/** Every run of a workflow (continued-as-new chains followed back), and of its children, recursively. */
async function historiesOf(client: Client, workflowId: string, seen = new Set<string>()): Promise<Run[]> {
  if (seen.has(workflowId)) return [];
  seen.add(workflowId);
  const runs: Run[] = [];
  let runId: string | undefined = (await client.workflow.getHandle(workflowId).describe()).runId;
  while (runId) {
    const history: temporal.api.history.v1.IHistory = await client.workflow.getHandle(workflowId, runId).fetchHistory();
    const events: HistoryEvent[] = history.events ?? [];
    const started: temporal.api.history.v1.IWorkflowExecutionStartedEventAttributes | null | undefined = events[0]?.workflowExecutionStartedEventAttributes;
    runs.unshift({ workflowId, type: started?.workflowType?.name ?? '?', events });
    runId = started?.continuedExecutionRunId || undefined;
  }
  const children = runs.flatMap((r) => r.events.flatMap((e) => e.startChildWorkflowExecutionInitiatedEventAttributes?.workflowId ?? []));
  for (const child of children) runs.push(...(await historiesOf(client, child, seen)));
  return runs;
}

interface Breakdown {
  workflows: Record<string, number>;
  workflowTasks: { count: number; scheduleToStartMs: number; runMs: number };
  /** The same per workflow type. */
  workflowTasksByType: Record<string, { count: number; scheduleToStartMs: number; runMs: number; maxRunMs: number }>;
  activities: Record<string, { count: number; runMs: number; scheduleToStartMs: number }>;
  childStarts: { count: number; totalMs: number; lastStartedAfterMs: number };
  signals: Record<string, number>;
  /** Per stream: its merge-ready signal to the merge decision it heard. */
  mergeReadyToMergedMs: number[];
  /**
   * Per merge in the objective: its merge activity scheduled to the decision sent (the queue's
   * service time); the decisions of one batch (patch batch-merge) share its time.
   */
  mergeServiceMs: number[];
  historyEvents: number;
  /**
   * Workflow tasks after a run's first, by the queue they were scheduled on: the worker's sticky
   * queue (its cache held the workflow) or the normal queue (a cache miss: the task carries the
   * whole history and the worker replays it).
   */
  stickyTasks: { hits: number; misses: number };
  /** The histories' size: every event encoded, and the payloads' bytes among them, per event type. */
  historyBytes: number;
  payloadBytes: Record<string, number>;
  /** With --timeline: timelineOf the runs. */
  timeline?: string[];
}

/** Bytes of every Payload (its data and metadata) inside an event, found by walking it. */
function payloadBytesIn(value: unknown): number {
  if (!value || typeof value !== 'object' || value instanceof Uint8Array) return 0;
  const o = value as Record<string, unknown>;
  if (o.data instanceof Uint8Array && o.metadata && typeof o.metadata === 'object') {
    return o.data.length + sum(Object.entries(o.metadata as Record<string, Uint8Array>).map(([k, v]) => k.length + (v?.length ?? 0)));
  }
  return sum(Object.values(o).map(payloadBytesIn));
}

/**
 * The objective and its children in time order, from the objective's start: one line per workflow
 * task, activity, outgoing signal and child, with how long it waited (scheduled -> started, or
 * initiated -> delivered) and ran. Events on the path from start to result show as the chain of
 * lines whose starts follow each other's ends.
 */
function timelineOf(runs: Run[]): string[] {
  const t0 = ms(runs[0].events[0]);
  const lines: { at: number; text: string }[] = [];
  const E = temporal.api.enums.v1.EventType;
  for (const run of runs) {
    const who = run.type === 'objectiveWorkflow' ? 'objective' : `${run.type.replace(/Workflow$/, '')} ${run.workflowId.split(/[./]/).pop()}`;
    const line = (from: HistoryEvent, what: string, started?: HistoryEvent, ended?: HistoryEvent) => {
      const wait = started ? `wait ${(ms(started) - ms(from)).toFixed(0)}` : '';
      const took = ended ? `${started ? ', ' : ''}${started ? 'run' : 'took'} ${(ms(ended) - ms(started ?? from)).toFixed(0)}` : '';
      lines.push({ at: ms(from), text: `${(ms(from) - t0).toFixed(0).padStart(6)} ms  ${who.padEnd(14)} ${what.padEnd(32)} ${wait}${took}` });
    };
    const endOf = (key: (e: HistoryEvent) => unknown, id: number) => run.events.find((e) => Number(key(e) ?? -1) === id);
    for (const e of run.events) {
      const id = Number(e.eventId);
      if (e.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED) line(e, 'started');
      else if (e.workflowTaskScheduledEventAttributes) {
        const started = endOf((x) => x.workflowTaskStartedEventAttributes?.scheduledEventId, id);
        const ended = endOf((x) => (x.workflowTaskCompletedEventAttributes ?? x.workflowTaskFailedEventAttributes ?? x.workflowTaskTimedOutEventAttributes)?.scheduledEventId, id);
        line(e, 'workflow task', started, ended);
      } else if (e.activityTaskScheduledEventAttributes) {
        const started = endOf((x) => x.activityTaskStartedEventAttributes?.scheduledEventId, id);
        const ended = endOf((x) => (x.activityTaskCompletedEventAttributes ?? x.activityTaskFailedEventAttributes ?? x.activityTaskTimedOutEventAttributes ?? x.activityTaskCanceledEventAttributes)?.scheduledEventId, id);
        line(e, `activity ${e.activityTaskScheduledEventAttributes.activityType?.name}`, started, ended);
      } else if (e.markerRecordedEventAttributes?.markerName === 'core_local_activity') line(e, 'local activity');
      else if (e.signalExternalWorkflowExecutionInitiatedEventAttributes) {
        const delivered = endOf((x) => (x.externalWorkflowExecutionSignaledEventAttributes ?? x.signalExternalWorkflowExecutionFailedEventAttributes)?.initiatedEventId, id);
        line(e, `signal ${e.signalExternalWorkflowExecutionInitiatedEventAttributes.signalName} ->`, undefined, delivered);
      } else if (e.workflowExecutionSignaledEventAttributes) line(e, `<- signal ${e.workflowExecutionSignaledEventAttributes.signalName}`);
      else if (e.startChildWorkflowExecutionInitiatedEventAttributes) {
        const started = endOf((x) => x.childWorkflowExecutionStartedEventAttributes?.initiatedEventId, id);
        const ended = endOf((x) => (x.childWorkflowExecutionCompletedEventAttributes ?? x.childWorkflowExecutionFailedEventAttributes ?? x.childWorkflowExecutionCanceledEventAttributes ?? x.childWorkflowExecutionTerminatedEventAttributes)?.initiatedEventId, id);
        line(e, `child ${e.startChildWorkflowExecutionInitiatedEventAttributes.workflowId?.split(/[./]/).pop()}`, started, ended);
      } else if (e.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED || e.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW || e.eventType === E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED) {
        line(e, E[e.eventType!].replace(/^EVENT_TYPE_WORKFLOW_EXECUTION_/, '').toLowerCase().replace(/_/g, ' '));
      }
    }
  }
  return lines.sort((a, b) => a.at - b.at).map((l) => l.text);
}

function breakdown(runs: Run[]): Breakdown {
  const b: Breakdown = {
    workflows: {},
    workflowTasks: { count: 0, scheduleToStartMs: 0, runMs: 0 },
    workflowTasksByType: {},
    activities: {},
    childStarts: { count: 0, totalMs: 0, lastStartedAfterMs: 0 },
    signals: {},
    mergeReadyToMergedMs: [],
    mergeServiceMs: [],
    historyEvents: 0,
    stickyTasks: { hits: 0, misses: 0 },
    historyBytes: 0,
    payloadBytes: {},
  };
  const objectiveStart = ms(runs[0].events[0]);
  for (const run of runs) {
    b.workflows[run.type] = (b.workflows[run.type] ?? 0) + 1;
    const byType = (b.workflowTasksByType[run.type] ??= { count: 0, scheduleToStartMs: 0, runMs: 0, maxRunMs: 0 });
    b.historyEvents += run.events.length;
    let firstTask = true;
    const byId = new Map(run.events.map((e) => [Number(e.eventId), e]));
    let mergeReadyAt: number | undefined;
    /** The stream's last events batch: with patch merge-request-in-events the merge request rides in it. */
    let lastBatchAt: number | undefined;
    let mergeScheduledAt: number | undefined;
    /** Decision signals sent since the last merge activity was scheduled (a batch sends several). */
    let decisions: number[] = [];
    const closeMerge = () => {
      if (mergeScheduledAt !== undefined && decisions.length > 0) {
        const each = (decisions.at(-1)! - mergeScheduledAt) / decisions.length;
        for (const _ of decisions) b.mergeServiceMs.push(each);
      }
      decisions = [];
    };
    for (const e of run.events) {
      const at = ms(e);
      b.historyBytes += temporal.api.history.v1.HistoryEvent.encode(e).finish().length;
      const payload = payloadBytesIn(e);
      if (payload > 0) {
        const type = temporal.api.enums.v1.EventType[e.eventType as number]?.replace(/^EVENT_TYPE_/, '') ?? String(e.eventType);
        b.payloadBytes[type] = (b.payloadBytes[type] ?? 0) + payload;
      }
      if (e.workflowTaskScheduledEventAttributes) {
        if (!firstTask) {
          if (e.workflowTaskScheduledEventAttributes.taskQueue?.kind === temporal.api.enums.v1.TaskQueueKind.TASK_QUEUE_KIND_STICKY) b.stickyTasks.hits += 1;
          else b.stickyTasks.misses += 1;
        }
        firstTask = false;
      } else if (e.workflowTaskStartedEventAttributes) {
        const waited = at - ms(byId.get(Number(e.workflowTaskStartedEventAttributes.scheduledEventId))!);
        b.workflowTasks.scheduleToStartMs += waited;
        byType.scheduleToStartMs += waited;
      } else if (e.workflowTaskCompletedEventAttributes) {
        b.workflowTasks.count += 1;
        const took = at - ms(byId.get(Number(e.workflowTaskCompletedEventAttributes.startedEventId))!);
        b.workflowTasks.runMs += took;
        byType.count += 1;
        byType.runMs += took;
        byType.maxRunMs = Math.max(byType.maxRunMs, took);
      } else if (e.activityTaskStartedEventAttributes) {
        const scheduled = byId.get(Number(e.activityTaskStartedEventAttributes.scheduledEventId))!;
        const name = scheduled.activityTaskScheduledEventAttributes!.activityType!.name!;
        const a = (b.activities[name] ??= { count: 0, runMs: 0, scheduleToStartMs: 0 });
        a.scheduleToStartMs += at - ms(scheduled);
      } else if (MERGE_ACTIVITIES.includes(e.activityTaskScheduledEventAttributes?.activityType?.name ?? '')) {
        // A bisected batch schedules several tries: the decisions count from its first.
        if (decisions.length > 0 || mergeScheduledAt === undefined) {
          closeMerge();
          mergeScheduledAt = at;
        }
      } else if (e.activityTaskCompletedEventAttributes || e.activityTaskFailedEventAttributes || e.activityTaskTimedOutEventAttributes) {
        const attrs = e.activityTaskCompletedEventAttributes ?? e.activityTaskFailedEventAttributes ?? e.activityTaskTimedOutEventAttributes!;
        const scheduled = byId.get(Number(attrs.scheduledEventId))!;
        const name = scheduled.activityTaskScheduledEventAttributes!.activityType!.name!;
        const a = (b.activities[name] ??= { count: 0, runMs: 0, scheduleToStartMs: 0 });
        a.count += 1;
        const startedId = 'startedEventId' in attrs ? Number(attrs.startedEventId) : 0;
        if (startedId) a.runMs += at - ms(byId.get(startedId)!);
      } else if (e.childWorkflowExecutionStartedEventAttributes) {
        b.childStarts.count += 1;
        b.childStarts.totalMs += at - ms(byId.get(Number(e.childWorkflowExecutionStartedEventAttributes.initiatedEventId))!);
        if (run.type === 'objectiveWorkflow') b.childStarts.lastStartedAfterMs = Math.max(b.childStarts.lastStartedAfterMs, at - objectiveStart);
      } else if (e.workflowExecutionSignaledEventAttributes) {
        const name = e.workflowExecutionSignaledEventAttributes.signalName!;
        b.signals[name] = (b.signals[name] ?? 0) + 1;
        // The stream waits for its decision after it asked: its last message before the decision asked.
        const askedAt = mergeReadyAt ?? lastBatchAt;
        if (name === mergeDecisionSignal.name && askedAt !== undefined) b.mergeReadyToMergedMs.push(at - askedAt);
        if (name === mergeDecisionSignal.name) mergeReadyAt = undefined;
      } else if (e.signalExternalWorkflowExecutionInitiatedEventAttributes) {
        const name = e.signalExternalWorkflowExecutionInitiatedEventAttributes.signalName;
        if (name === streamMergeReadySignal.name) mergeReadyAt = at;
        if (name === streamEventsSignal.name) lastBatchAt = at;
        if (name === mergeDecisionSignal.name && mergeScheduledAt !== undefined) decisions.push(at);
      }
    }
    closeMerge();
  }
  if (TIMELINE) b.timeline = timelineOf(runs);
  return b;
}

// --- the run ------------------------------------------------------------------------------------

interface Sample {
  wallMs: number;
  serverCpu: number;
  workerCpu: number;
  childrenCpu: number;
  /** The server's counters over the case (serverCounters). */
  serverWork: Record<string, number>;
  /** The worker's resident memory when the objective ended. */
  workerRssMb: number;
  floorMs: number;
  sandcastleMs?: number;
  breakdown: Breakdown;
}

async function main() {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'slipway-bench-orch-'));
  const children: ChildProcess[] = [];
  let server: Awaited<ReturnType<typeof startDevServer>> | undefined;
  try {
    log(`starting the Temporal dev server and a worker (in ${dir})`);
    const metricsPort = await freePort();
    server = await startDevServer({ dataDir: path.join(dir, 'temporal'), port: await freePort(), metricsPort, headless: true, startTimeoutMs: 120_000 });
    const metricsUrl = `http://127.0.0.1:${metricsPort}/metrics`;
    const address = server.address;
    /** A worker of one checkout's build on its own task queue and SLIPWAY_HOME. */
    const startWorker = async (label: string, bin: string, profile = false) => {
      const taskQueue = `bench-${label}-${randomBytes(3).toString('hex')}`;
      const worker = spawn(process.execPath, [...(profile && CPU_PROF ? ['--cpu-prof', '--cpu-prof-dir', path.resolve(CPU_PROF)] : []), bin, 'worker'], {
        env: { ...process.env, TEMPORAL_ADDRESS: address, SLIPWAY_TASK_QUEUE: taskQueue, SLIPWAY_HOME: path.join(dir, `home-${label}`) },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.push(worker);
      const w = { label, taskQueue, pid: worker.pid!, output: '' };
      worker.stdout!.on('data', (c) => (w.output += c));
      worker.stderr!.on('data', (c) => (w.output += c));
      await new Promise<void>((resolve, reject) => {
        const check = () => (w.output.includes('worker polling') ? resolve() : worker.exitCode !== null ? reject(new Error(`the worker exited:\n${w.output}`)) : setTimeout(check, 100));
        check();
      });
      return w;
    };
    type Worker = Awaited<ReturnType<typeof startWorker>>;
    // With --against, that checkout's worker runs each case first ("A"), this one's second ("B").
    const workers: Worker[] = [...(AGAINST ? [await startWorker('A', path.join(path.resolve(AGAINST), 'bin', 'slipway.cjs'))] : []), await startWorker(AGAINST ? 'B' : 'this', BIN, true)];
    const client = new Client({ connection: await Connection.connect({ address }), dataConverter: slipwayDataConverter() });
    const serverPid = server.process.pid!;

    let sandcastle: Sandcastle | undefined;
    let sandcastleNote = 'left out (--no-sandcastle)';
    if (SANDCASTLE) {
      const loaded = await loadSandcastle();
      if (typeof loaded === 'string') sandcastleNote = `not run: ${loaded}`;
      else {
        sandcastle = loaded;
        sandcastleNote = `@ai-hero/sandcastle ${SANDCASTLE_VERSION}, noSandbox(), a branch per stream, at most ${SANDCASTLE_PARALLEL} runs at a time, merges by a script`;
        // Sandcastle adds a safe.directory per worktree to the global git config: a file of the bench's.
        const globalConfig = path.join(dir, 'sandcastle-gitconfig');
        writeFileSync(globalConfig, '');
        process.env.GIT_CONFIG_GLOBAL = globalConfig;
      }
    }

    let n = 0;
    const runObjective = async (streams: number, gates: boolean, worker: Worker): Promise<Sample> => {
      const { taskQueue, pid: workerPid, output } = worker;
      const repo = makeRepo(dir);
      const id = `bench-${streams}-${++n}`;
      const input = await loadObjectiveFile(objectiveFile(dir, repo, streams, gates), { repository: repo, id });
      const m0 = await serverCounters(metricsUrl);
      const s0 = cpuOf(serverPid);
      const w0 = cpuOf(workerPid);
      const t0 = performance.now();
      const result: ObjectiveResult = await client.workflow.execute(objectiveWorkflow, { taskQueue, workflowId: objectiveWorkflowId(id), args: [input] });
      const wallMs = performance.now() - t0;
      const s1 = cpuOf(serverPid);
      const w1 = cpuOf(workerPid);
      const serverWork = diffCounters(m0, await serverCounters(metricsUrl));
      if (result.outcome !== 'completed' || result.mergeOrder.length !== streams) {
        throw new Error(`objective ${id} ended ${result.outcome} with ${result.mergeOrder.length}/${streams} merged: ${result.error ?? ''}\n${output.slice(-4000)}`);
      }
      const floorRepo = makeRepo(dir);
      const f0 = performance.now();
      sh(floorRepo, floorScript(streams, gates));
      const floorMs = performance.now() - f0;
      let sandcastleMs: number | undefined;
      for (let attempt = 1; sandcastle && sandcastleMs === undefined; attempt++) {
        try {
          sandcastleMs = await sandcastleObjective(sandcastle, makeRepo(dir), streams, gates);
        } catch (e) {
          // Its own concurrency limit (the global git config's lock): a fresh repository, again.
          log(`Sandcastle failed (try ${attempt} of 3): ${(e as Error).message.split('\n')[0]}`);
          if (attempt >= 3) break;
        }
      }
      return {
        wallMs,
        serverCpu: s1.self - s0.self,
        workerCpu: w1.self - w0.self,
        childrenCpu: w1.children - w0.children,
        serverWork,
        workerRssMb: rssMbOf(workerPid),
        floorMs,
        sandcastleMs,
        breakdown: breakdown(await historiesOf(client, objectiveWorkflowId(id))),
      };
    };

    log('warm-up (untimed): one objective of 2 streams per worker');
    for (const w of workers) await runObjective(2, true, w);

    const cases = STREAMS.map((streams) => ({ streams, gates: streams > 1 }));
    const samples = new Map<string, Sample[]>(workers.flatMap((w) => cases.map((c) => [`${w.label}:${c.streams}`, []])));
    for (let round = 0; round < ROUNDS; round++) {
      // Each round in another order, so drift hits all cases alike.
      const order = cases.map((_, i) => cases[(i + round) % cases.length]);
      for (const c of order) {
        for (const w of workers) {
          const s = await runObjective(c.streams, c.gates, w);
          samples.get(`${w.label}:${c.streams}`)!.push(s);
          log(`round ${round + 1}${workers.length > 1 ? ` ${w.label}` : ''}: ${c.streams} stream${c.streams > 1 ? 's' : ''}: ${(s.wallMs / 1000).toFixed(2)} s (floor ${(s.floorMs / 1000).toFixed(2)} s${s.sandcastleMs === undefined ? '' : `, Sandcastle ${(s.sandcastleMs / 1000).toFixed(2)} s`})`);
        }
      }
    }

    const reportOf = (w: Worker) => cases.map((c) => {
      const xs = samples.get(`${w.label}:${c.streams}`)!;
      const b = xs[Math.floor(xs.length / 2)].breakdown;
      return {
        streams: c.streams,
        gates: c.gates ? 'true' : 'none',
        wallS: median(xs.map((x) => x.wallMs)) / 1000,
        floorS: median(xs.map((x) => x.floorMs)) / 1000,
        sandcastleS: sandcastle && xs.some((x) => x.sandcastleMs !== undefined) ? median(xs.flatMap((x) => x.sandcastleMs ?? [])) / 1000 : undefined,
        serverCpuS: median(xs.map((x) => x.serverCpu)),
        workerCpuS: median(xs.map((x) => x.workerCpu)),
        childrenCpuS: median(xs.map((x) => x.childrenCpu)),
        workerRssMb: median(xs.map((x) => x.workerRssMb)),
        mergeReadyToMergedMs: { median: median(xs.flatMap((x) => x.breakdown.mergeReadyToMergedMs)), max: Math.max(...xs.flatMap((x) => x.breakdown.mergeReadyToMergedMs)) },
        mergeServiceMs: median(xs.flatMap((x) => x.breakdown.mergeServiceMs)),
        serverWork: xs[Math.floor(xs.length / 2)].serverWork,
        breakdown: b,
      };
    });
    const summarize = (report: ReturnType<typeof reportOf>) => {
      const one = report.find((r) => r.streams === 1);
      const many = report.filter((r) => r.streams > 1);
      const perAdded = many.map((r) => {
        const base = one ?? report[0];
        const added = r.streams - base.streams;
        return {
          streams: r.streams,
          wallS: (r.wallS - base.wallS) / added,
          cpuS: (r.serverCpuS + r.workerCpuS - base.serverCpuS - base.workerCpuS) / added,
          serverCpuS: (r.serverCpuS - base.serverCpuS) / added,
          workerCpuS: (r.workerCpuS - base.workerCpuS) / added,
          floorS: (r.floorS - base.floorS) / added,
        };
      });
      return { report, perAdded };
    };
    const printReport = (label: string, { report, perAdded }: ReturnType<typeof summarize>) => {
      if (label) console.log(`\n=== ${label}`);
      console.log('streams  gates  wall s   floor s  Sandcastle s  server CPU-s  worker CPU-s  agents+gates+git CPU-s  merge-ready->merged ms (median/max)  merge service ms');
      for (const r of report) {
        console.log(
          `${String(r.streams).padStart(7)}  ${r.gates.padEnd(5)}  ${r.wallS.toFixed(2).padStart(6)}   ${r.floorS.toFixed(2).padStart(6)}   ${(r.sandcastleS?.toFixed(2) ?? '-').padStart(11)}   ${r.serverCpuS.toFixed(2).padStart(11)}   ${r.workerCpuS.toFixed(2).padStart(11)}   ${r.childrenCpuS.toFixed(2).padStart(21)}   ${`${r.mergeReadyToMergedMs.median.toFixed(0)} / ${r.mergeReadyToMergedMs.max.toFixed(0)}`.padStart(34)}   ${r.mergeServiceMs.toFixed(0).padStart(15)}`,
        );
      }
      console.log('\nper added stream (against 1 stream): wall s, server+worker CPU-s (server, worker), floor s');
      for (const p of perAdded) console.log(`  ${String(p.streams).padStart(3)} streams: ${p.wallS.toFixed(3)} s wall, ${p.cpuS.toFixed(3)} CPU-s (server ${p.serverCpuS.toFixed(3)}, worker ${p.workerCpuS.toFixed(3)}), floor ${p.floorS.toFixed(3)} s`);
      const service = median(report.flatMap((r) => (r.streams > 1 ? [r.mergeServiceMs] : [])));
      if (!Number.isNaN(service)) console.log(`merge queue: ${service.toFixed(0)} ms per merge when queued, ${(1000 / service).toFixed(1)} merges/s`);
      console.log('\nbreakdown from the histories (median round; times summed over all workflows of the objective)');
      for (const r of report) {
        const b = r.breakdown;
        const acts = Object.entries(b.activities)
          .sort((x, y) => y[1].runMs - x[1].runMs)
          .map(([name, a]) => `${name} ${a.count}x run ${a.runMs.toFixed(0)} ms wait ${a.scheduleToStartMs.toFixed(0)} ms`)
          .join('; ');
        const kb = (bytes: number) => `${(bytes / 1024).toFixed(0)} KB`;
        const payloads = Object.entries(b.payloadBytes).sort((x, y) => y[1] - x[1]);
        console.log(`  ${r.streams} streams: ${Object.entries(b.workflows).map(([t, c]) => `${c} ${t}`).join(', ')}; ${b.historyEvents} events, ${kb(b.historyBytes)}`);
        console.log(`    server ${((1000 * r.serverCpuS) / b.historyEvents).toFixed(2)} CPU-ms per history event; worker ${((1000 * r.workerCpuS) / b.workflowTasks.count).toFixed(1)} CPU-ms per workflow task (activities included), resident ${r.workerRssMb.toFixed(0)} MB`);
        const work = r.serverWork;
        const persistence = Object.keys(work)
          .filter((k) => k.startsWith('persistence_requests ') || k.startsWith('visibility_persistence_requests '))
          .map((k) => ({ op: k.split(' ')[1] + (k.startsWith('visibility') ? ' (visibility)' : ''), count: work[k], ms: 1000 * (work[k.replace('_requests', '_latency_sum')] ?? 0) }))
          .sort((x, y) => y.ms - x.ms);
        const matches = Object.entries(work).filter(([k]) => /match/.test(k)).map(([k, v]) => `${k.replace(/_count/, '').trim()} ${v}`);
        console.log(`    server: ${sum(persistence.map((p) => p.count))} SQLite operations, ${sum(persistence.map((p) => p.ms)).toFixed(0)} ms in them; most time: ${persistence.slice(0, 5).map((p) => `${p.op} ${p.count}x ${p.ms.toFixed(0)} ms`).join(', ')}${matches.length ? `; ${matches.join(', ')}` : ''}`);
        const queued = Object.keys(work)
          .filter((k) => k.startsWith('task_latency_load_count ') && k.includes('Transfer'))
          .map((k) => ({ op: k.split(' ')[1]!.replace('TransferActiveTask', ''), count: work[k]!, ms: 1000 * (work[k.replace('_count', '_sum')] ?? 0) }));
        if (queued.length) console.log(`    transfer queue (written -> read): ${(sum(queued.map((q) => q.ms)) / sum(queued.map((q) => q.count))).toFixed(1)} ms per task over ${sum(queued.map((q) => q.count))}; ${queued.map((q) => `${q.op} ${(q.ms / q.count).toFixed(1)} ms`).join(', ')}`);
        console.log(`    payloads ${kb(sum(payloads.map(([, v]) => v)))}: ${payloads.slice(0, 4).map(([t, v]) => `${t} ${kb(v)}`).join(', ')}`);
        console.log(`    workflow tasks: ${b.workflowTasks.count}, run ${b.workflowTasks.runMs.toFixed(0)} ms, waited ${b.workflowTasks.scheduleToStartMs.toFixed(0)} ms (scheduled -> started); after a run's first: ${b.stickyTasks.hits} on the sticky queue, ${b.stickyTasks.misses} on the normal queue (cache misses, full replays)`);
        for (const [type, t] of Object.entries(b.workflowTasksByType)) {
          console.log(`      ${type}: ${t.count}, run ${t.runMs.toFixed(0)} ms (longest ${t.maxRunMs.toFixed(0)} ms), waited ${t.scheduleToStartMs.toFixed(0)} ms`);
        }
        console.log(`    child starts: ${b.childStarts.count}, ${b.childStarts.totalMs.toFixed(0)} ms initiated -> started in all, last stream started ${b.childStarts.lastStartedAfterMs.toFixed(0)} ms after the objective`);
        console.log(`    signals: ${Object.entries(b.signals).map(([name, c]) => `${name} ${c}`).join(', ')}`);
        console.log(`    activities (wait = schedule-to-start, waiting for a worker slot): ${acts}`);
        if (b.timeline && r.streams <= 4) console.log(`    timeline (ms from the objective's start; wait = scheduled -> started, run = started -> ended, took = sent -> delivered):\n${b.timeline.map((l) => `    ${l}`).join('\n')}`);
      }
    };
    const results = workers.map((w) => ({ label: w.label, ...summarize(reportOf(w)) }));
    /** B's figure over A's per case (below 1: B is faster), when a checkout to compare with was given. */
    const ratios = results.length === 2
      ? results[1].report.map((b, i) => {
          const a = results[0].report[i];
          return {
            streams: b.streams,
            wall: b.wallS / a.wallS,
            cpu: (b.serverCpuS + b.workerCpuS) / (a.serverCpuS + a.workerCpuS),
            serverCpu: b.serverCpuS / a.serverCpuS,
            workerCpu: b.workerCpuS / a.workerCpuS,
            mergeReadyToMerged: b.mergeReadyToMergedMs.median / a.mergeReadyToMergedMs.median,
            mergeService: b.mergeServiceMs / a.mergeServiceMs,
            workflowTasks: b.breakdown.workflowTasks.count / a.breakdown.workflowTasks.count,
          };
        })
      : undefined;
    if (asJson) {
      console.log(JSON.stringify({ rounds: ROUNDS, sandcastle: sandcastleNote, cores: os.cpus().length, loadAverage: os.loadavg()[0], against: AGAINST, results, ratios }, null, 2));
      return;
    }
    const settings = slipwaySettings();
    console.log(`\norchestration, ${ROUNDS} round${ROUNDS > 1 ? 's' : ''} (medians), ${os.cpus().length} cores, load average ${os.loadavg()[0].toFixed(1)}; worker: ${settings.workflowTaskConcurrency} workflow tasks, ${settings.activityConcurrency} activities, ${settings.agentConcurrency} agent runs at once`);
    console.log(`Sandcastle: ${sandcastleNote}`);
    for (const r of results) printReport(results.length > 1 ? `${r.label}: ${r.label === 'A' ? path.resolve(AGAINST!) : 'this checkout'}` : '', r);
    if (ratios) {
      console.log('\nB / A, case by case (below 1: this checkout is faster): wall, server+worker CPU (server, worker), merge-ready->merged (median), merge service, workflow tasks');
      for (const r of ratios) console.log(`  ${String(r.streams).padStart(3)} streams: wall ${r.wall.toFixed(2)}, CPU ${r.cpu.toFixed(2)} (server ${r.serverCpu.toFixed(2)}, worker ${r.workerCpu.toFixed(2)}), merge-ready->merged ${r.mergeReadyToMerged.toFixed(2)}, merge service ${r.mergeService.toFixed(2)}, workflow tasks ${r.workflowTasks.toFixed(2)}`);
    }
  } finally {
    for (const c of children) if (c.exitCode === null) c.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode === null ? new Promise((r) => c.once('exit', r)) : undefined)));
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
