/**
 * Stream workflow: one parallel slice of an objective.
 * sandbox -> build -> gates -> review -> merge_ready, with a fix loop back to build on a gate
 * failure or a rejection (at most maxFixIterations), then waits for the merge queue's decision.
 */
import {
  ApplicationFailure,
  ActivityFailure,
  CancellationScope,
  ChildWorkflowFailure,
  ParentClosePolicy,
  condition,
  defineQuery,
  defineSignal,
  getExternalWorkflowHandle,
  isCancellation,
  setCurrentDetails,
  setHandler,
  startChild,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { FAILURE_KINDS, isFailureKind, type FailureKind } from '../core/failures';
import { integrationBranch, sandboxWorkflowId, streamBranch, streamSandboxId } from '../core/ids';
import { SlipwayKind, SlipwayObjective, SlipwayPhase, SlipwayStream } from '../core/search-attributes';
import type { StreamPhase } from '../core/states';
import type { AttemptRecord, Feedback, MergeDecision, MergeRequest, SandboxInfo, StreamInput, StreamResult, StreamStatus } from '../core/types';
import { agentActivities, gateActivities, gitActivities } from './activity-options';
import { releaseSandboxSignal, sandboxReadySignal, sandboxWorkflow } from './sandbox';

/** Sent by a stream to its objective when its work passed gates and review. */
export const streamMergeReadySignal = defineSignal<[MergeRequest]>('streamMergeReady');
/** Sent by the objective's merge queue to tell the stream what became of its merge. */
export const mergeDecisionSignal = defineSignal<[MergeDecision]>('mergeDecision');
export const streamStatusQuery = defineQuery<StreamStatus>('streamStatus');

/** Reads the failure kind off an activity or child failure. */
export function failureKindOf(err: unknown): FailureKind {
  let cause: unknown = err;
  while (cause instanceof ActivityFailure || cause instanceof ChildWorkflowFailure) cause = cause.cause;
  if (cause instanceof ApplicationFailure && isFailureKind(cause.type)) return cause.type;
  return 'unknown';
}

export function failureMessage(err: unknown): string {
  let cause: unknown = err;
  while ((cause instanceof ActivityFailure || cause instanceof ChildWorkflowFailure) && cause.cause) cause = cause.cause;
  return cause instanceof Error ? cause.message : String(cause);
}

export async function streamWorkflow(input: StreamInput): Promise<StreamResult> {
  const { objective, stream } = input;
  const branch = streamBranch(objective.id, stream.id);
  const status: StreamStatus = { streamId: stream.id, phase: 'provisioning', iteration: 0, branch, attempts: [] };
  let sandbox: SandboxInfo | undefined;
  let decision: MergeDecision | undefined;

  setHandler(streamStatusQuery, () => status);
  setHandler(sandboxReadySignal, (info) => {
    sandbox = info;
  });
  setHandler(mergeDecisionSignal, (d) => {
    decision = d;
  });
  upsertSearchAttributes([
    { key: SlipwayKind, value: 'stream' },
    { key: SlipwayObjective, value: objective.id },
    { key: SlipwayStream, value: stream.id },
  ]);
  const enter = (phase: StreamPhase, details: string) => {
    status.phase = phase;
    upsertSearchAttributes([{ key: SlipwayPhase, value: phase }]);
    setCurrentDetails(`**${phase}**${status.iteration ? ` (iteration ${status.iteration})` : ''} — ${details}`);
  };
  const record = (step: AttemptRecord['step'], kind: FailureKind, summary: string) => {
    status.attempts.push({
      iteration: status.iteration,
      step,
      kind,
      summary,
      action: FAILURE_KINDS[kind].action,
      at: new Date().toISOString(),
    });
  };
  const fail = (kind: FailureKind, summary: string): StreamResult => {
    status.failure = { kind, summary };
    enter('failed', summary);
    return { streamId: stream.id, status: 'failed', branch, iterations: status.iteration, failure: status.failure, attempts: status.attempts };
  };

  enter('provisioning', `starting sandbox for \`${branch}\``);
  const sandboxId = streamSandboxId(objective.id, stream.id);
  const sandboxHandle = await startChild(sandboxWorkflow, {
    workflowId: sandboxWorkflowId(sandboxId),
    args: [
      {
        sandboxId,
        provider: 'local',
        repository: objective.repository,
        objectiveId: objective.id,
        name: stream.id,
        branch,
        base: input.base,
        ownerWorkflowId: workflowInfo().workflowId,
      },
    ],
    parentClosePolicy: ParentClosePolicy.REQUEST_CANCEL,
    staticSummary: `Sandbox for stream ${stream.id} of ${objective.id}`,
    staticDetails: `Local git worktree on branch \`${branch}\`, started from \`${input.base}\`.`,
  });
  let sandboxEnded = false;
  const sandboxResult = sandboxHandle.result().finally(() => {
    sandboxEnded = true;
  });

  const release = async () => {
    await CancellationScope.nonCancellable(async () => {
      if (!sandboxEnded) {
        await getExternalWorkflowHandle(sandboxHandle.workflowId).signal(releaseSandboxSignal);
        await sandboxResult;
      }
    });
  };

  try {
    await condition(() => sandbox !== undefined || sandboxEnded);
    if (!sandbox) {
      const ended = await sandboxResult;
      record('sandbox', 'sandbox_failure', ended.error ?? 'sandbox ended before it was ready');
      return fail('sandbox_failure', `sandbox could not be created: ${ended.error ?? 'unknown error'}`);
    }
    status.sandboxPath = sandbox.path;
    const result = await buildUntilMerged(input, sandbox, status, enter, record, fail, () => decision, () => {
      decision = undefined;
    });
    return result;
  } catch (err) {
    if (isCancellation(err)) throw err;
    const kind = failureKindOf(err);
    record('build', kind, failureMessage(err));
    return fail(kind, failureMessage(err));
  } finally {
    await release();
  }
}

async function buildUntilMerged(
  input: StreamInput,
  sandbox: SandboxInfo,
  status: StreamStatus,
  enter: (phase: StreamPhase, details: string) => void,
  record: (step: AttemptRecord['step'], kind: FailureKind, summary: string) => void,
  fail: (kind: FailureKind, summary: string) => StreamResult,
  currentDecision: () => MergeDecision | undefined,
  clearDecision: () => void,
): Promise<StreamResult> {
  const { objective, stream } = input;
  const git = gitActivities();
  const gateTimeout = input.gates.reduce((sum, g) => sum + g.timeout_seconds, 0);
  const gates = gateActivities(gateTimeout);
  const builder = agentActivities(input.agents.builder.timeout_minutes);
  const reviewer = input.agents.reviewer ? agentActivities(input.agents.reviewer.timeout_minutes) : undefined;
  const target = integrationBranch(objective.id);
  const maxIterations = input.maxFixIterations + 1;
  let feedback: Feedback | undefined;
  let sessionId: string | undefined;

  const agentInput = (role: 'builder' | 'reviewer') => ({
    role,
    spec: role === 'builder' ? input.agents.builder : input.agents.reviewer!,
    sandboxPath: sandbox.path,
    objectiveDir: objective.objectiveDir,
    objective: { id: objective.id, text: objective.objective },
    stream: { id: stream.id, task: stream.task, branch: sandbox.branch },
    targetBranch: target,
    iteration: status.iteration,
    feedback,
  });

  for (status.iteration = 1; status.iteration <= maxIterations; status.iteration++) {
    enter('building', feedback ? `fixing: ${feedback.summary}` : stream.task);
    const built = await builder.runAgent({ ...agentInput('builder'), resumeSessionId: sessionId });
    sessionId = built.sessionId ?? sessionId;
    const commit = await git.commitWork({ path: sandbox.path, message: `slipway(${stream.id}): iteration ${status.iteration}\n\n${stream.task}` });

    if (input.gates.length > 0) {
      enter('gates', `running ${input.gates.map((g) => g.name).join(', ')}`);
      const gateRun = await gates.runGates({ path: sandbox.path, gates: input.gates });
      if (!gateRun.passed) {
        const failed = gateRun.results.find((r) => !r.passed)!;
        const summary = `gate "${failed.name}" ${failed.timedOut ? 'timed out' : `exited with ${failed.exitCode}`}`;
        record('gates', 'quality_gate_failure', summary);
        feedback = { kind: 'quality_gate_failure', summary, details: gateRun.failureReport };
        continue;
      }
    }

    if (reviewer) {
      enter('reviewing', `reviewing ${commit.head.slice(0, 10)}`);
      const review = await reviewer.runAgent(agentInput('reviewer'));
      if (review.verdict?.verdict !== 'approve') {
        const summary = review.verdict?.summary ?? 'the reviewer rejected the change';
        record('review', 'review_rejection', summary);
        feedback = { kind: 'review_rejection', summary, details: review.verdict?.findings.map((f) => `- ${f}`).join('\n') ?? '' };
        continue;
      }
    }

    enter('merge_ready', `waiting for the merge queue (${commit.head.slice(0, 10)})`);
    clearDecision();
    await getExternalWorkflowHandle(input.parentWorkflowId).signal(streamMergeReadySignal, {
      streamId: stream.id,
      branch: sandbox.branch,
      headCommit: commit.head,
    });
    await condition(() => currentDecision() !== undefined);
    const decision = currentDecision()!;
    if (decision.status === 'merged') {
      enter('merged', `merged as ${decision.commit.slice(0, 10)}`);
      return { streamId: stream.id, status: 'merged', branch: sandbox.branch, iterations: status.iteration, mergeCommit: decision.commit, attempts: status.attempts };
    }
    record('merge', decision.kind, decision.summary);
    return fail(decision.kind, decision.summary);
  }
  status.iteration = maxIterations;
  return fail(feedback?.kind ?? 'unknown', `fix loop exhausted after ${maxIterations} iterations: ${feedback?.summary ?? ''}`);
}
