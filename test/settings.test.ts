/** Worker settings from the environment: defaults, and a bad value named in the error. */
import { describe, expect, it } from 'vitest';
import { DEFAULT_WORKFLOW_TASK_CONCURRENCY, slipwaySettings } from '../lib/settings';

describe('worker settings', () => {
  it('runs 16 workflow tasks at once unless SLIPWAY_WORKFLOW_TASK_CONCURRENCY says otherwise', () => {
    expect(DEFAULT_WORKFLOW_TASK_CONCURRENCY).toBe(16);
    expect(slipwaySettings({}).workflowTaskConcurrency).toBe(16);
    expect(slipwaySettings({ SLIPWAY_WORKFLOW_TASK_CONCURRENCY: '8' }).workflowTaskConcurrency).toBe(8);
  });

  it.each(['zero', '0', '-2', '1.5'])('refuses SLIPWAY_WORKFLOW_TASK_CONCURRENCY=%s, naming it', (value) => {
    expect(() => slipwaySettings({ SLIPWAY_WORKFLOW_TASK_CONCURRENCY: value })).toThrow(/SLIPWAY_WORKFLOW_TASK_CONCURRENCY/);
  });
});
