import { objectiveWorkflowId } from '../../core/ids';
import type { AgentRunRecord, ObjectiveInput, ObjectiveResult, ObjectiveStreamView } from '../../core/types';
import { formatCost, formatCount, formatTotals, formatUsage } from '../../core/usage';
import { slipwaySettings } from '../../lib/settings';
import { CliError, EXIT } from '../exit-codes';
import { hasWorkflowPollers, openRuntime } from '../runtime';

export interface RunOptions {
  follow?: boolean;
  json?: boolean;
  repo?: string;
  id?: string;
  base?: string;
  /** `--no-agent-checks`: the agents' executables and credentials are not checked on this machine. */
  agentChecks?: boolean;
}

export async function runCommand(file: string, opts: RunOptions): Promise<number> {
  // Required here, not at the top: `status` and `watch` load this module for its renderers only,
  // and the objective file's loader is most of this module's load time (ADR 0016).
  const { loadObjectiveFile, ObjectiveFileError } = require('../../config/objective-file') as typeof import('../../config/objective-file');
  const { assertObjectiveIdFree, ObjectiveStartError, startObjectiveWorkflow } = require('../../workers/start-objective') as typeof import('../../workers/start-objective');
  const { checkAgentsOnThisMachine } = require('../../activities/agents/preflight') as typeof import('../../activities/agents/preflight');
  const { ProjectEnvError } = require('../../agents/credentials') as typeof import('../../agents/credentials');
  let input: ObjectiveInput;
  try {
    input = await loadObjectiveFile(file, { repository: opts.repo, id: opts.id, baseBranch: opts.base });
    if (process.env.SLIPWAY_OWNER_GRACE_SECONDS) input.ownerGraceSeconds = slipwaySettings().ownerGraceSeconds;
  } catch (e) {
    if (e instanceof ObjectiveFileError) throw new CliError(e.message, EXIT.badInput);
    throw e;
  }
  if (opts.agentChecks !== false) {
    let problems;
    try {
      problems = await checkAgentsOnThisMachine(input);
    } catch (e) {
      if (e instanceof ProjectEnvError) throw new CliError(e.message, EXIT.badInput);
      throw e;
    }
    if (problems.length > 0) throw new CliError(problems.map((p) => `${input.sourceFile ?? file}: ${p.field}: ${p.message}`).join('\n'), EXIT.badInput);
  }
  // Checked before a server is started for it (and again when it starts).
  await assertObjectiveIdFree(input).catch((e) => {
    throw e instanceof ObjectiveStartError ? new CliError(e.message, EXIT.badInput) : e;
  });
  // Progress goes to stderr so `--json` leaves stdout to the one result document.
  const log = (line: string) => process.stderr.write(`${line}\n`);
  const runtime = await openRuntime({ startIfMissing: true, log });
  try {
    const { client, settings, target } = runtime;
    const workflowId = objectiveWorkflowId(input.id);
    let handle;
    try {
      handle = await startObjectiveWorkflow(client, settings.taskQueue, input);
    } catch (e) {
      if (e instanceof ObjectiveStartError) throw new CliError(e.message.replace(/; choose another id$/, '; choose another id with --id'), EXIT.badInput);
      throw e;
    }
    const follow = opts.follow || runtime.hostsWorker;
    if (!opts.json) log(`started ${workflowId}${target.uiUrl ? ` — ${target.uiUrl}/namespaces/${target.namespace}/workflows/${encodeURIComponent(workflowId)}` : ''}`);
    if (!runtime.hostsWorker && !(await hasWorkflowPollers(client, target.namespace, settings.taskQueue))) {
      log(`warning: no worker polls task queue "${settings.taskQueue}"; start one with \`slipway worker\` (or \`slipway dev\`)`);
    }
    if (!follow) {
      if (opts.json) process.stdout.write(`${JSON.stringify({ objectiveId: input.id, workflowId, started: true })}\n`);
      return EXIT.ok;
    }
    // Required here: its feed query loads the workflow code, which `status` (using this module's renderers) must not (ADR 0024).
    const { followObjective } = require('../follow') as typeof import('../follow');
    await followObjective(handle, opts.json ? () => undefined : log);
    let result: ObjectiveResult;
    try {
      result = await handle.result();
    } catch (e) {
      const message = (e as Error).message;
      if (opts.json) process.stdout.write(`${JSON.stringify({ objectiveId: input.id, workflowId, outcome: 'failed', error: message })}\n`);
      else log(`objective ${input.id} failed: ${message}`);
      return EXIT.runFailed;
    }
    const uiUrl = target.uiUrl ? `${target.uiUrl}/namespaces/${target.namespace}/workflows/${encodeURIComponent(workflowId)}` : undefined;
    if (opts.json) {
      process.stdout.write(`${JSON.stringify({ workflowId, webUi: uiUrl, ...result })}\n`);
    } else {
      process.stdout.write(renderResult(result, uiUrl));
    }
    return result.outcome === 'completed' ? EXIT.ok : EXIT.runFailed;
  } finally {
    await runtime.close();
  }
}

export function renderResult(result: ObjectiveResult, uiUrl?: string): string {
  const lines = [
    `objective ${result.objectiveId}: ${result.outcome}`,
    `integration branch: ${result.integrationBranch}${result.integrationHead ? ` @ ${result.integrationHead.slice(0, 12)}` : ''}`,
    `merged (in order): ${result.mergeOrder.join(', ') || 'none'}`,
    ...plannerLines(result.agentRuns),
    ...result.streams.flatMap((s) => [
      `  ${s.id.padEnd(16)} ${s.phase.padEnd(8)} iterations=${s.iterations}${streamUsage(s)}${s.failure ? `  ${s.failure.kind}: ${s.failure.summary}` : ''}`,
      ...agentRunLines(result.agentRuns, s.id),
    ]),
    `agent usage: ${formatTotals(result.usage)}`,
  ];
  if (result.error) lines.splice(1, 0, `error: ${result.error}`);
  if (uiUrl) lines.push(`Web UI: ${uiUrl}`);
  return `${lines.join('\n')}\n`;
}

/** One line per agent run of a stream (`undefined`: the planner's), indented under it. */
export function agentRunLines(runs: AgentRunRecord[] | undefined, streamId: string | undefined): string[] {
  return (runs ?? [])
    .filter((r) => r.stream === streamId)
    .map((r) => {
      const loop = r.maxIterations > 1 ? ` run ${r.agentIteration}/${r.maxIterations}` : '';
      const ending = r.result === 'signalled' ? ', completion signal' : r.result === 'invalid_output' ? ', answer unusable' : r.result === 'budget_stopped' ? ', stopped at the budget (hard_limit)' : '';
      return `      ${r.role}${loop} (${r.provider}${r.model ? ` ${r.model}` : ''}): ${formatUsage(r)}, ${(r.durationMs / 1000).toFixed(1)} s${ending}`;
    });
}

/** The planner's runs under a `planner` heading (nothing when streams came from the file). */
export function plannerLines(runs: AgentRunRecord[] | undefined): string[] {
  const lines = agentRunLines(runs, undefined);
  return lines.length > 0 ? ['  (planner)', ...lines] : [];
}

/** `  tokens=12,345/678 cost=$0.0421` (`cost=~$0.0421 (estimated)`) for a stream's agent runs (nothing before its first run). */
export function streamUsage(s: Pick<ObjectiveStreamView, 'usage'>): string {
  const u = s.usage;
  if (!u?.runs) return '';
  const cost = u.costUsd ? ` cost=${u.estimated ? `~${formatCost(u.costUsd)} (estimated)` : formatCost(u.costUsd)}` : '';
  // Runs of an agent that reports no token counts (Copilot) are not in the figures: say how many.
  const unknown = u.usageUnknownRuns ? ` usage-unknown=${u.usageUnknownRuns}` : '';
  return `  tokens=${formatCount(u.inputTokens)}/${formatCount(u.outputTokens)}${cost}${unknown}`;
}
