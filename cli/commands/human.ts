/** The human loop: `approve`, `reject`, `mail` (escalations) and `mail send` (guidance). */
import { WorkflowNotFoundError, WorkflowUpdateFailedError, type Client } from '@temporalio/client';
import { AGENT_ROLES } from '../../core/states';
import { objectiveWorkflowId, streamWorkflowId } from '../../core/ids';
import type { LedgerEntry, ObjectiveStatus } from '../../core/types';
import { objectiveStatusQuery, planDecisionUpdate } from '../../workflows/objective';
import { guidanceUpdate } from '../../workflows/stream';
import { CliError, EXIT } from '../exit-codes';
import { describeObjective, openRuntime } from '../runtime';

export async function objectiveStatus(client: Client, objectiveId: string): Promise<ObjectiveStatus> {
  const { handle, description } = await describeObjective(client, objectiveId);
  if (description.status.name !== 'RUNNING') throw new CliError(`objective "${objectiveId}" is not running (${description.status.name.toLowerCase()})`);
  return handle.query(objectiveStatusQuery);
}

export function updateError(e: unknown): never {
  if (e instanceof WorkflowUpdateFailedError) throw new CliError(`refused: ${(e.cause as Error | undefined)?.message ?? e.message}`);
  if (e instanceof WorkflowNotFoundError) throw new CliError(`refused: ${e.message}`);
  throw e;
}

export async function planDecisionCommand(objectiveId: string, approve: boolean, reason?: string): Promise<number> {
  if (!approve && !reason?.trim()) throw new CliError('reject needs --reason "..."');
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    await objectiveStatus(runtime.client, objectiveId);
    await runtime.client.workflow
      .getHandle(objectiveWorkflowId(objectiveId))
      .executeUpdate(planDecisionUpdate, { args: [{ approve, reason }] })
      .catch(updateError);
    process.stdout.write(`${approve ? 'approved' : 'rejected'} the plan of ${objectiveId}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

interface Escalation {
  objectiveId: string;
  streamId: string;
  mailbox: string;
  step: string;
  kind: string;
  summary: string;
  since: string;
  attempts: LedgerEntry[];
}

export async function mailListCommand(agent: string | undefined, opts: { objective?: string; json?: boolean }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const ids: string[] = [];
    if (opts.objective) ids.push(opts.objective);
    else {
      for await (const wf of runtime.client.workflow.list({ query: 'SlipwayKind = "objective" AND ExecutionStatus = "Running"' })) {
        ids.push(wf.workflowId.replace(/^objective:/, ''));
      }
    }
    const escalations: Escalation[] = [];
    for (const id of ids) {
      const status = await objectiveStatus(runtime.client, id);
      for (const stream of status.streams) {
        if (!stream.blocked) continue;
        if (agent && agent !== stream.blocked.mailbox && agent !== stream.id) continue;
        escalations.push({
          objectiveId: id,
          streamId: stream.id,
          ...stream.blocked,
          attempts: status.ledger.filter((e) => e.stream === stream.id),
        });
      }
    }
    if (opts.json) process.stdout.write(`${JSON.stringify(escalations)}\n`);
    else if (escalations.length === 0) process.stdout.write('no escalations waiting\n');
    else {
      for (const e of escalations) {
        process.stdout.write(
          [
            `${e.mailbox}  (objective ${e.objectiveId}, stream ${e.streamId}, blocked since ${e.since})`,
            `  step ${e.step}: ${e.kind}: ${e.summary}`,
            '  attempts:',
            ...e.attempts.map((a) => `    ${a.at.slice(11, 19)} ${a.step} ${a.kind} -> ${a.action} (${a.attempt}/${a.maxAttempts}) ${a.result}: ${a.summary}`),
            ...(e.kind === 'budget_exhausted' ? [`  raise: slipway budget raise ${e.objectiveId} --stream ${e.streamId} --usd N (without --stream: the objective's limit)`] : []),
            `  reply: slipway mail send ${e.mailbox} "subject" "guidance" --objective ${e.objectiveId}`,
            '',
          ].join('\n'),
        );
      }
    }
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

/** `builder-api` -> `api` when `api` is a stream; a bare stream id works too. */
export function streamForAgent(agent: string, streamIds: string[]): string | undefined {
  if (streamIds.includes(agent)) return agent;
  for (const role of AGENT_ROLES) {
    const prefix = `${role}-`;
    if (agent.startsWith(prefix) && streamIds.includes(agent.slice(prefix.length))) return agent.slice(prefix.length);
  }
  return undefined;
}

export async function mailSendCommand(agent: string, subject: string, body: string, opts: { objective?: string }): Promise<number> {
  if (!opts.objective) throw new CliError('mail send needs --objective <id>');
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const status = await objectiveStatus(runtime.client, opts.objective);
    const streamId = streamForAgent(agent, status.streams.map((s) => s.id));
    if (!streamId) {
      const mailboxes = status.streams.filter((s) => s.blocked).map((s) => s.blocked!.mailbox);
      throw new CliError(`unknown agent "${agent}" in objective ${opts.objective}${mailboxes.length ? `; waiting mailboxes: ${mailboxes.join(', ')}` : '; no stream is blocked'}`);
    }
    const view = status.streams.find((s) => s.id === streamId)!;
    if (!view.blocked) throw new CliError(`refused: stream "${streamId}" is not blocked (it is ${view.phase}); guidance is only taken by a blocked stream`);
    const ack = await runtime.client.workflow
      .getHandle(streamWorkflowId(opts.objective, streamId))
      .executeUpdate(guidanceUpdate, { args: [{ agent, subject, body }] })
      .catch(updateError);
    process.stdout.write(`guidance delivered to ${agent}; stream ${ack.streamId} resumes at step ${ack.resumesAt}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}
