/** What agents are told after a merge-conflict rebuild: the reviewer sees both intents. */
import { describe, expect, it } from 'vitest';
import { buildPrompt, builtinValues, contextEnv, type PromptContext } from '../agents/prompt';
import { BUILTIN_KEYS } from '../agents/template';

const base: PromptContext = {
  role: 'reviewer',
  objective: 'o',
  objectiveId: 'obj',
  streamId: 's1',
  task: 'add greeting',
  iteration: 2,
  agentIteration: 1,
  maxIterations: 1,
  completionSignals: ['<promise>COMPLETE</promise>'],
  sourceBranch: 'slipway/obj/s1',
  targetBranch: 'slipway/obj/integration',
};
const rebuilt = 'conflict in greet.js\n\nYour previous change:\n-old\n+mine';

describe('rebuild context', () => {
  it('a reviewer of a rebuilt stream is told the conflict, the earlier change and to reject an overwrite', () => {
    const prompt = buildPrompt({ ...base, rebuilt });
    expect(prompt).toContain('rebuilt on top of slipway/obj/integration after it conflicted');
    expect(prompt).toContain('Reject the change if it drops, reverts or overwrites the merged work');
    expect(prompt).toContain(rebuilt);
    expect(builtinValues({ ...base, rebuilt }).REBUILD).toContain(rebuilt);
    expect(contextEnv({ ...base, rebuilt }).SLIPWAY_REBUILD).toContain(rebuilt);
    expect(BUILTIN_KEYS).toContain('REBUILD');
  });

  it('says nothing of it to a stream that was not rebuilt', () => {
    expect(buildPrompt(base)).not.toContain('rebuilt');
    expect(builtinValues(base).REBUILD).toBe('');
    expect(contextEnv(base).SLIPWAY_REBUILD).toBe('');
  });
});
