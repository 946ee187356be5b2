/**
 * Slipway as a library: start an objective from an object, follow its live feed, read the result.
 *
 *   npx tsx examples/library/hello.ts <path to a git repository>
 *
 * Needs a Temporal server with a Slipway worker: `slipway dev` in another terminal (or
 * TEMPORAL_ADDRESS and `slipway worker`). In a project that installed Slipway, import from
 * 'slipway' instead of '../../index'. test/library.test.ts runs this file.
 */
import { connect, ObjectiveFileError, type ObjectiveSpec } from '../../index';

async function main(): Promise<number> {
  const repository = process.argv[2];
  if (!repository) {
    process.stderr.write('usage: hello.ts <repository>\n');
    return 2;
  }
  const spec: ObjectiveSpec = {
    objective: 'Say hello',
    repository,
    // The builder: any command (here a script agent); real agents are `provider: claude-code` and friends.
    agents: { builder: { provider: 'script', command: 'echo "hello from slipway" > hello.txt' } },
    streams: [{ id: 'hello', task: 'write hello.txt' }],
    ...(process.env.EXAMPLE_OBJECTIVE_ID ? { id: process.env.EXAMPLE_OBJECTIVE_ID } : {}),
  };
  const slipway = await connect();
  try {
    const objective = await slipway.startObjective(spec);
    process.stdout.write(`started ${objective.id}\n`);
    for await (const e of objective.events()) process.stdout.write(`[${e.source}] ${e.text}\n`);
    const result = await objective.result();
    process.stdout.write(`outcome: ${result.outcome}; merged: ${result.mergeOrder.join(', ') || 'none'} into ${result.integrationBranch}\n`);
    return result.outcome === 'completed' ? 0 : 1;
  } catch (e) {
    // The same checks and messages as an objective file, naming the field.
    if (e instanceof ObjectiveFileError) {
      process.stderr.write(`${e.message}\n`);
      return 2;
    }
    throw e;
  } finally {
    await slipway.close();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`);
    process.exitCode = 1;
  },
);
