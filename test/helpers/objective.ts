/** Writes objective files (and agent plans) for integration tests. */
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { stringify } from 'yaml';
import { DEMO_DIR, PROJECT_ROOT, tempDir } from './repo';

export const PLAN_BUILDER = path.join(PROJECT_ROOT, 'test', 'fixtures', 'agents', 'plan-builder.mjs');
export const DEMO_BUILDER = path.join(DEMO_DIR, 'agents', 'builder.mjs');
export const DEMO_REVIEWER = path.join(DEMO_DIR, 'agents', 'reviewer.mjs');

export type PlanStep = { files?: Record<string, string>; exit?: number; commit?: boolean; sleep_ms?: number };
/** Builder steps per stream (`<stream>:guided` for after guidance), and `_plans` for the planner. */
export type Plan = Record<string, PlanStep[] | Array<{ streams: Array<{ id: string; task: string; depends_on?: string[] }> }>>;

/** A passing helper and its test, as a plan step. */
export function helperFiles(name: string, body = `(x) => x`, assertion = `assert.ok(true)`): Record<string, string> {
  return {
    [`src/${name}.js`]: `module.exports = { ${name}: ${body} };\n`,
    [`test/${name}.test.js`]: `const test = require('node:test');\nconst assert = require('node:assert');\nconst { ${name} } = require('../src/${name}');\ntest('${name}', () => { ${assertion}; });\n`,
  };
}

export function writeObjective(spec: Record<string, unknown>, plan?: Plan): string {
  const dir = tempDir('slipway-objective-');
  const file = path.join(dir, 'objective.yaml');
  writeFileSync(file, stringify(spec));
  if (plan) writeFileSync(path.join(dir, 'plan.json'), JSON.stringify(plan, null, 2));
  return file;
}
