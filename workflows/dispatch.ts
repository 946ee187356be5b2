/**
 * Stream dispatch, pure: which streams may start now, from which commit, and which can never
 * start because a dependency ended without landing.
 *
 * A dependent stream starts from the merge commit of its dependency (the one merged last when
 * it has several: the integration branch is linear, so that commit holds the others too), never
 * from the integration branch's name, which an activity would resolve later, possibly in the
 * middle of another stream's merge that is then reverted.
 *
 * The objective workflow (workflows/objective.ts) is the shell: it starts the children this
 * returns and records the failures. Bundled into workflow code: types and pure helpers only.
 */
import type { StreamBudget } from '../core/budget';
import { FINAL_STREAM_PHASES, type StreamPhase } from '../core/states';
import type { Blueprint, ObjectiveInput, StreamInput, StreamSpec } from '../core/types';

export interface DispatchView {
  id: string;
  phase: StreamPhase;
}

export interface DispatchState {
  streams: Pick<StreamSpec, 'id' | 'depends_on'>[];
  views: DispatchView[];
  /** Streams whose child workflow runs now. */
  running: number;
  maxParallel: number;
  /** Where streams without dependencies start (the objective's base commit). */
  baseCommit: string;
  /** Landed streams: id -> the commit a dependent starts from. */
  landed: Record<string, string>;
  /** Stream ids in the order they landed. */
  mergeOrder: string[];
}

export type DispatchDecision =
  | { type: 'start'; streamId: string; base: string }
  /** A dependency ended without landing: the stream can never start. */
  | { type: 'fail'; streamId: string; summary: string };

/** What to do now, in the streams' order; starts stop at the parallelism bound. */
export function dispatch(s: DispatchState): DispatchDecision[] {
  const phase = new Map(s.views.map((v) => [v.id, v.phase]));
  const decisions: DispatchDecision[] = [];
  let slots = s.maxParallel - s.running;
  for (const spec of s.streams) {
    if (phase.get(spec.id) !== 'waiting') continue;
    const notLanded = spec.depends_on.find((d) => s.landed[d] === undefined && isFinal(phase.get(d)));
    if (notLanded) {
      decisions.push({ type: 'fail', streamId: spec.id, summary: `dependency "${notLanded}" did not merge (it ended ${phase.get(notLanded)})` });
      continue;
    }
    if (spec.depends_on.some((d) => s.landed[d] === undefined) || slots <= 0) continue;
    decisions.push({ type: 'start', streamId: spec.id, base: baseOf(spec.depends_on, s) });
    slots -= 1;
  }
  return decisions;
}

function isFinal(phase: StreamPhase | undefined): boolean {
  return phase !== undefined && FINAL_STREAM_PHASES.includes(phase);
}

/** The base commit, or the landing commit of the dependency that landed last. */
function baseOf(dependsOn: string[], s: DispatchState): string {
  if (dependsOn.length === 0) return s.baseCommit;
  const last = dependsOn.reduce((a, b) => (s.mergeOrder.indexOf(a) >= s.mergeOrder.indexOf(b) ? a : b));
  return s.landed[last];
}

/** A started stream's input and its summary lines in the Temporal UI. */
export function streamStart(
  input: ObjectiveInput,
  spec: StreamSpec,
  at: { base: string; baseCommit: string; integrationBranch: string; blueprint: Blueprint; parentWorkflowId: string; budget?: StreamBudget },
): { input: StreamInput; summary: string; details: string } {
  return {
    input: {
      objective: { id: input.id, objective: input.objective, repository: input.repository, objectiveDir: input.objectiveDir },
      stream: spec,
      base: at.base,
      integrationBranch: at.integrationBranch,
      gates: input.gates,
      agents: input.agents,
      blueprint: at.blueprint,
      maxFixIterations: input.maxFixIterations,
      onExhausted: input.onExhausted,
      parentWorkflowId: at.parentWorkflowId,
      sandbox: input.sandbox,
      ...(at.budget ? { budget: at.budget } : {}),
      ...(input.ownerGraceSeconds ? { ownerGraceSeconds: input.ownerGraceSeconds } : {}),
    },
    summary: `Stream ${spec.id}: ${truncate(spec.task, 120)}`,
    details: `Objective \`${input.id}\`, blueprint \`${at.blueprint.id}\`, builds on \`${at.base === at.baseCommit ? input.baseBranch : at.base}\`.`,
  };
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}
