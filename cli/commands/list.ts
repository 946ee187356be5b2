import { SlipwayCostUsd, SlipwayOutcome, SlipwayPhase } from '../../core/search-attributes';
import { formatCost } from '../../core/usage';
import { openRuntime } from '../runtime';
import { EXIT } from '../exit-codes';

export async function listCommand(opts: { json?: boolean; limit?: number }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const rows: Array<{ objectiveId: string; workflowId: string; status: string; phase?: string; outcome?: string; costUsd?: number; startTime: string }> = [];
    for await (const wf of runtime.client.workflow.list({ query: 'SlipwayKind = "objective"' })) {
      rows.push({
        objectiveId: wf.workflowId.replace(/^objective:/, ''),
        workflowId: wf.workflowId,
        status: wf.status.name.toLowerCase(),
        phase: wf.typedSearchAttributes.get(SlipwayPhase),
        outcome: wf.typedSearchAttributes.get(SlipwayOutcome),
        // Absent until the first run with a cost (and on objectives started before the attribute existed).
        costUsd: wf.typedSearchAttributes.get(SlipwayCostUsd),
        startTime: wf.startTime.toISOString(),
      });
      if (rows.length >= (opts.limit ?? 50)) break;
    }
    if (opts.json) process.stdout.write(`${JSON.stringify(rows)}\n`);
    else if (rows.length === 0) process.stdout.write('no objectives\n');
    else {
      for (const r of rows) {
        const cost = r.costUsd !== undefined ? formatCost(r.costUsd) : '';
        process.stdout.write(`${r.startTime.slice(0, 19).replace('T', ' ')}  ${r.objectiveId.padEnd(32)} ${r.status.padEnd(10)} ${(r.outcome ?? r.phase ?? '').padEnd(12)} ${cost}`.trimEnd() + '\n');
      }
    }
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}
