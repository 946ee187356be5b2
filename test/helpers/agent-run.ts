/** The input of one `runAgent` activity with the script provider, as a stream's builder would send it. */
import type { AgentRunInput } from '../../activities/agents/run-agent';
import { AgentSchema } from '../../core/objective-schema';

export function scriptAgentInput(a: { command: string; sandboxPath: string; repository: string; objectiveDir: string; stream?: string; branch?: string }, extra: Partial<AgentRunInput> = {}): AgentRunInput {
  const stream = a.stream ?? 'one';
  return {
    role: 'builder',
    spec: AgentSchema.parse({ provider: 'script', command: a.command }),
    sandboxPath: a.sandboxPath,
    repository: a.repository,
    objectiveDir: a.objectiveDir,
    objective: { id: 'obj', text: 'objective' },
    stream: { id: stream, task: 'task', branch: a.branch ?? `slipway/obj/${stream}` },
    targetBranch: 'slipway/obj/integration',
    iteration: 1,
    ...extra,
  };
}
