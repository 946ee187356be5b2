/**
 * `slipway budget raise <objective> [--stream S] --usd N --tokens N`: a new spending limit for an
 * objective or one of its streams. The objective's Update validates it (positive, above what is
 * already spent) and a stream blocked on its budget goes on (docs/adr/0017-budget-guardrail.md).
 */
import type { Command } from 'commander';
import { formatLimit, type BudgetRaise } from '../../core/budget';
import { CliError, EXIT } from '../exit-codes';
import { GROUP_DESCRIPTIONS } from '../verbs';
import { describeObjective, openRuntime } from '../runtime';

/** A flag's number, or a clear error naming the flag (the objective checks the rest). */
export function parseBudgetFigure(flag: '--usd' | '--tokens', value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n)) throw new CliError(`${flag} must be a number, got "${value}"`);
  return n;
}

export async function budgetRaiseCommand(objectiveId: string, opts: { stream?: string; usd?: string; tokens?: string; json?: boolean }): Promise<number> {
  const raise: BudgetRaise = {
    ...(opts.stream !== undefined ? { stream: opts.stream } : {}),
    ...(opts.usd !== undefined ? { usd: parseBudgetFigure('--usd', opts.usd) } : {}),
    ...(opts.tokens !== undefined ? { tokens: parseBudgetFigure('--tokens', opts.tokens) } : {}),
  };
  if (raise.usd === undefined && raise.tokens === undefined) throw new CliError('budget raise needs --usd N, --tokens N or both');
  // Loaded here: `slipway budget --help` need not load the workflows and the Temporal SDK (ADR 0016, 3).
  const { budgetRaiseUpdate } = require('../../workflows/objective') as typeof import('../../workflows/objective');
  const { updateError } = require('./human') as typeof import('./human');
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const { handle, description } = await describeObjective(runtime.client, objectiveId);
    if (description.status.name !== 'RUNNING') throw new CliError(`objective "${objectiveId}" is not running (${description.status.name.toLowerCase()})`);
    const ack = await handle.executeUpdate(budgetRaiseUpdate, { args: [raise] }).catch(updateError);
    if (opts.json) process.stdout.write(`${JSON.stringify(ack)}\n`);
    else process.stdout.write(`budget of ${ack.stream ? `stream ${ack.stream} of ` : ''}${objectiveId} is now ${formatLimit(ack.limit)}\n`);
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}

export function registerBudgetCommands(program: Command, setExit: (code: number) => void): void {
  const budget = program.command('budget').description(GROUP_DESCRIPTIONS.budget);
  budget
    .command('raise')
    .description("raise the objective's limit, or one stream's with --stream; a stream blocked on its budget goes on")
    .argument('<objective-id>')
    .option('--stream <id>', "raise this stream's limit instead of the objective's")
    .option('--usd <n>', 'the new limit in US dollars')
    .option('--tokens <n>', 'the new limit in tokens (input plus output)')
    .option('--json', 'print JSON')
    .action(async (id: string, opts) => setExit(await budgetRaiseCommand(id, opts)));
}
