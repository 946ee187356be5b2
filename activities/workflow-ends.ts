/**
 * When other workflows have closed, read from Temporal. A continued-as-new objective has no child
 * handle on the streams an earlier run started: it hears their end through their final event,
 * which a stream sends while it removes its sandbox (docs/adr/0037), so before its result it asks
 * here until those streams have closed (their cleanup done).
 */
import { WorkflowFailedError, WorkflowNotFoundError, type Client } from '@temporalio/client';

export function createWorkflowEndActivities(deps: { client: Client }) {
  return {
    /**
     * Returns once every workflow in `workflowIds` has closed, however it ended (a workflow that
     * does not exist counts as closed). Waits by long poll, so it needs no heartbeat.
     */
    async workflowsClosed(input: { workflowIds: string[] }): Promise<void> {
      await Promise.all(
        input.workflowIds.map(async (id) => {
          try {
            await deps.client.workflow.getHandle(id).result();
          } catch (e) {
            // Failed, cancelled, terminated or timed out: closed. Anything else (the server out of reach) is retried.
            if (!(e instanceof WorkflowFailedError) && !(e instanceof WorkflowNotFoundError)) throw e;
          }
        }),
      );
    },
  };
}
export type WorkflowEndActivities = ReturnType<typeof createWorkflowEndActivities>;
