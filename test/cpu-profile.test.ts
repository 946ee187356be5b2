/** bench/tools/cpu-profile.ts: self time per function and per package from a V8 CPU profile. */
import { describe, expect, it } from 'vitest';
import { hotSpots, whereOf } from '../bench/tools/cpu-profile';

describe('cpu profile hot spots', () => {
  it('names a package, a scoped package, a node built-in and V8 itself', () => {
    expect(whereOf('file:///x/node_modules/rxjs/dist/cjs/a.js')).toBe('rxjs');
    expect(whereOf('/x/node_modules/@temporalio/worker/lib/worker.js')).toBe('@temporalio/worker');
    expect(whereOf('node:internal/child_process')).toBe('node:internal/child_process');
    expect(whereOf('/work/slipway/dist/lib/git.js')).toBe('dist/lib/git.js');
    expect(whereOf('')).toBe('(native or V8)');
  });

  it('sums self time per function and per package, leaving idle out', () => {
    const node = (id: number, functionName: string, url: string, children: number[] = []) => ({ id, callFrame: { functionName, url, lineNumber: 9 }, children });
    const profile = {
      nodes: [node(1, '(root)', '', [2, 3, 4]), node(2, 'spawn', 'node:internal/child_process'), node(3, 'parse', '/a/node_modules/yaml/dist/p.js'), node(4, '(idle)', '')],
      samples: [2, 2, 3, 4, 2],
      timeDeltas: [1000, 1000, 500, 7000, 1000],
      startTime: 0,
      endTime: 10_500,
    };
    const { totalMs, byFunction, byWhere } = hotSpots(profile);
    expect(totalMs).toBe(3.5);
    expect(byFunction[0]).toEqual(['spawn node:internal/child_process:10', 3]);
    expect(byWhere).toEqual([
      ['node:internal/child_process', 3],
      ['yaml', 0.5],
    ]);
  });
});
