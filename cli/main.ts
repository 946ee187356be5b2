/**
 * The `slipway` CLI. It validates input, then starts, signals or queries workflows; the work
 * itself happens in workers.
 */
import { Command, CommanderError } from 'commander';
import { CliError, EXIT } from './exit-codes';
import { PayloadKeyError } from '../workers/payload-codec';
import { cancelCommand } from './commands/cancel';
import { listCommand } from './commands/list';
import { runCommand } from './commands/run';
import { devCommand, workerCommand } from './commands/serve';
import { statusCommand } from './commands/status';
import { mailListCommand, mailSendCommand, planDecisionCommand } from './commands/human';
import { watchCommand } from './commands/watch';
import { registerAccountCommands } from './commands/account';
import { registerApiCommands } from './commands/api';
import { registerCodecServerCommand } from './commands/codec-server';
import { registerSandboxCommands } from './commands/sandbox';
import { registerSchedulesCommands } from './commands/schedules';
import { registerTemplateCommands } from './commands/template';
import { registerTrustCommand } from './commands/trust';
import { registerWorktreeCommands } from './commands/worktree';

export function buildProgram(): Command {
  const program = new Command('slipway')
    .description('Runs AI coding agents in parallel, isolated sandboxes and merges their work, durably on Temporal.')
    .version('0.1.0')
    .exitOverride()
    .enablePositionalOptions()
    .showHelpAfterError('(run with --help for usage)');

  program
    .command('run')
    .description('start an objective from a YAML file (follows it to the end when this command hosts the embedded server)')
    .argument('<objective.yaml>', 'objective file')
    .option('-f, --follow', 'wait for the outcome, printing progress')
    .option('--json', 'print the result as one JSON document on stdout')
    .option('--repo <path>', 'repository to work on (overrides `repository` in the file)')
    .option('--id <id>', 'objective id (overrides `id` in the file)')
    .option('--base <branch>', 'base branch (overrides `base_branch`)')
    .action(async (file: string, opts) => setExit(await runCommand(file, opts)));

  program
    .command('status')
    .description("show an objective's phase, streams and outcome")
    .argument('<objective-id>')
    .option('--json', 'print JSON')
    .action(async (id: string, opts) => setExit(await statusCommand(id, opts)));

  program
    .command('list')
    .description('list objectives (newest first)')
    .option('--json', 'print JSON')
    .option('--limit <n>', 'at most this many', (v) => Number.parseInt(v, 10), 50)
    .action(async (opts) => setExit(await listCommand(opts)));

  program
    .command('watch')
    .description('follow the live feed of an objective (the newest running one by default) until it ends')
    .option('--objective <id>', 'objective to watch')
    .option('--stream <id>', 'only this stream')
    .option('--agent <name>', 'only this agent mailbox, e.g. builder-api')
    .action(async (opts) => setExit(await watchCommand(opts)));

  program
    .command('cancel')
    .description('stop an objective: its streams are cancelled and cleaned up, what was merged stays on the integration branch')
    .argument('<objective-id>')
    .option('--no-wait', 'return once the cancellation is requested')
    .option('--json', 'print the result as one JSON document on stdout')
    .action(async (id: string, opts) => setExit(await cancelCommand(id, opts)));

  program
    .command('approve')
    .description('approve the plan an objective is waiting on')
    .argument('<objective-id>')
    .action(async (id: string) => setExit(await planDecisionCommand(id, true)));

  program
    .command('reject')
    .description('reject the plan an objective is waiting on; the planner tries again with the reason')
    .argument('<objective-id>')
    .requiredOption('--reason <text>', 'why the plan is rejected')
    .action(async (id: string, opts) => setExit(await planDecisionCommand(id, false, opts.reason)));

  const mail = program
    .command('mail')
    .description('escalations waiting for guidance (one per blocked stream), optionally for one agent mailbox')
    .argument('[agent]', 'mailbox, e.g. builder-api')
    .option('--objective <id>', 'only this objective')
    .option('--json', 'print JSON')
    .enablePositionalOptions()
    .action(async (agent: string | undefined, opts) => setExit(await mailListCommand(agent, opts)));
  mail
    .command('send')
    .description('send guidance to a blocked stream; its next attempt carries it')
    .argument('<agent>', 'mailbox, e.g. builder-api')
    .argument('<subject>')
    .argument('<body>')
    .requiredOption('--objective <id>', 'objective of the stream')
    .action(async (agent: string, subject: string, body: string, opts) => setExit(await mailSendCommand(agent, subject, body, opts)));

  program
    .command('dev')
    .description('start the embedded Temporal server (Web UI on 8233) and a worker in the foreground')
    .action(async () => setExit(await devCommand()));

  program
    .command('worker')
    .description('run a worker against TEMPORAL_ADDRESS or the running embedded server')
    .option('--id <worker-id>', 'this worker\'s id (default: SLIPWAY_WORKER_ID, else the one kept in $SLIPWAY_HOME/worker-id)')
    .action(async (opts: { id?: string }) => setExit(await workerCommand(opts)));

  // The sandbox service: `sandbox ...` (API client), `api`, `mcp`, and ledger administration.
  registerSandboxCommands(program);
  registerApiCommands(program, setExit);
  registerAccountCommands(program);
  // Local sandboxes: the janitor's schedule, the prepared template, one stream's work.
  registerSchedulesCommands(program, setExit);
  registerTemplateCommands(program, setExit);
  registerWorktreeCommands(program, setExit);
  // A repository's own config (.slipway/config.yaml, blueprints) is used only once trusted.
  registerTrustCommand(program, setExit);
  // Encrypted history payloads (SLIPWAY_PAYLOAD_KEY), readable in the Web UI through this.
  registerCodecServerCommand(program, setExit);

  return program;
}

function setExit(code: number) {
  process.exitCode = code;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
    return typeof process.exitCode === 'number' ? process.exitCode : EXIT.ok;
  } catch (e) {
    if (e instanceof CommanderError) {
      // --help and --version exit through here with code 0.
      return e.exitCode === 0 ? EXIT.ok : EXIT.badInput;
    }
    if (e instanceof CliError) {
      process.stderr.write(`slipway: ${e.message}\n`);
      return e.exitCode;
    }
    if (e instanceof PayloadKeyError) {
      // Raised while reading settings, before anything starts; the message never holds a key.
      process.stderr.write(`slipway: ${e.message}\n`);
      return EXIT.badInput;
    }
    process.stderr.write(`slipway: ${(e as Error).stack ?? String(e)}\n`);
    return EXIT.runFailed;
  }
}

if (require.main === module) {
  main(process.argv).then((code) => {
    process.exitCode = code;
    // Native handles (gRPC, the Core runtime) may keep the loop alive; the work is done.
    setTimeout(() => process.exit(code), 100).unref();
  });
}
