/**
 * Pure helpers for interpreting a blueprint: step lookup, fix-loop bounds, exhaustion modes,
 * retry attempts. Shared by the objective and stream workflows.
 */
import { RETRY_PROFILES } from '../core/retry-profiles';
import type { Blueprint, ExhaustionMode, Step } from '../core/blueprint-schema';

export interface WalkOverrides {
  maxFixIterations?: number;
  onExhausted?: ExhaustionMode;
}

export function startStep(blueprint: Blueprint): Step {
  return blueprint.start ? stepById(blueprint, blueprint.start) : blueprint.steps[0];
}

export function stepById(blueprint: Blueprint, id: string): Step {
  const step = blueprint.steps.find((s) => s.id === id);
  if (!step) throw new Error(`blueprint ${blueprint.id} has no step "${id}"`);
  return step;
}

export function nextStep(blueprint: Blueprint, step: Step): Step | undefined {
  return step.next ? stepById(blueprint, step.next) : undefined;
}

/** How many times a step may send work back through `on_fail` (or rebuild after a merge failure). */
export function fixLimit(blueprint: Blueprint, step: Step, overrides: WalkOverrides = {}): number {
  return step.max_fix_iterations ?? overrides.maxFixIterations ?? blueprint.max_fix_iterations;
}

export function exhaustionMode(blueprint: Blueprint, step: Step, overrides: WalkOverrides = {}): ExhaustionMode {
  return step.retry?.on_exhausted ?? overrides.onExhausted ?? blueprint.on_exhausted;
}

/** Temporal activity attempts for a step: the step's override, else the blueprint's profile. */
export function retryAttempts(blueprint: Blueprint, step: Step): number {
  return step.retry?.max_attempts ?? RETRY_PROFILES[blueprint.retry.profile].maximumAttempts;
}

/** The retry policy inputs for a step's activities. */
export function retryFor(blueprint: Blueprint, step: Step): { maximumAttempts: number; initialIntervalMs?: number } {
  const seconds = blueprint.retry.initial_interval_seconds;
  return { maximumAttempts: retryAttempts(blueprint, step), initialIntervalMs: seconds === undefined ? undefined : Math.round(seconds * 1000) };
}

/** The first agent step with the given role (where a rebuild starts). */
export function firstStepWithRole(blueprint: Blueprint, role: string): Step | undefined {
  return blueprint.steps.find((s) => s.type === 'agent' && s.role === role);
}

/** The agent role that acts on a failure of `step`: the step itself, or the agent its on_fail goes to. */
export function actingRole(blueprint: Blueprint, step: Step): string {
  if (step.type === 'agent') return step.role;
  if (step.on_fail) {
    const target = stepById(blueprint, step.on_fail);
    if (target.type === 'agent') return target.role;
  }
  return 'builder';
}
