/**
 * Starting an objective workflow: one place for the CLI's `run` and the library's
 * `startObjective` (index.ts): the id check, the workflow id, search attributes, summary.
 */
import { WorkflowExecutionAlreadyStartedError, type Client, type WorkflowHandle } from '@temporalio/client';
import { objectiveIdInUse } from '../activities/objective-id';
import { objectiveWorkflowId } from '../core/ids';
import { SlipwayKind, SlipwayObjective } from '../core/search-attributes';
import type { ObjectiveInput } from '../core/types';
import { objectiveWorkflow } from '../workflows/objective';

/** The objective could not start: its id is taken (in the repository or on the server). Nothing was started. */
export class ObjectiveStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ObjectiveStartError';
  }
}

/** Throws when the repository already has an objective of this id (prepareObjective claims it atomically when it runs). */
export async function assertObjectiveIdFree(input: Pick<ObjectiveInput, 'repository' | 'id' | 'remote'>): Promise<void> {
  // A remote's clone is on the worker that prepares the objective, which claims the id there.
  if (input.remote) return;
  const inUse = await objectiveIdInUse(input.repository, input.id);
  if (inUse) throw new ObjectiveStartError(inUse);
}

export async function startObjectiveWorkflow(client: Client, taskQueue: string, input: ObjectiveInput): Promise<WorkflowHandle<typeof objectiveWorkflow>> {
  await assertObjectiveIdFree(input);
  const workflowId = objectiveWorkflowId(input.id);
  try {
    return await client.workflow.start(objectiveWorkflow, {
      taskQueue,
      workflowId,
      args: [input],
      workflowIdReusePolicy: 'REJECT_DUPLICATE',
      typedSearchAttributes: [
        { key: SlipwayKind, value: 'objective' },
        { key: SlipwayObjective, value: input.id },
      ],
      staticSummary: `Objective ${input.id}: ${input.objective.slice(0, 160)}`,
      staticDetails: [
        `Repository \`${input.repository}\`, base \`${input.baseBranch || 'its default branch'}\`.`,
        '',
        ...input.streams.map((s) => `- **${s.id}**${s.depends_on.length ? ` (after ${s.depends_on.join(', ')})` : ''}: ${s.task}`),
      ].join('\n'),
    });
  } catch (e) {
    if (e instanceof WorkflowExecutionAlreadyStartedError) throw new ObjectiveStartError(`objective "${input.id}" already exists (workflow ${workflowId}); choose another id`);
    throw e;
  }
}
