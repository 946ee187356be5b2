import { formatCost } from '../../core/usage';
import { EXIT } from '../exit-codes';
import { withObjectiveReader } from '../objective-reader';

export async function listCommand(opts: { json?: boolean; limit?: number }): Promise<number> {
  const rows = await withObjectiveReader((reader) => reader.list(opts.limit ?? 50));
  if (opts.json) process.stdout.write(`${JSON.stringify(rows)}\n`);
  else if (rows.length === 0) process.stdout.write('no objectives\n');
  else {
    for (const r of rows) {
      const cost = r.costUsd !== undefined ? formatCost(r.costUsd) : '';
      process.stdout.write(`${r.startTime.slice(0, 19).replace('T', ' ')}  ${r.objectiveId.padEnd(32)} ${r.status.padEnd(10)} ${(r.outcome ?? r.phase ?? '').padEnd(12)} ${cost}`.trimEnd() + '\n');
    }
  }
  return EXIT.ok;
}
