/**
 * The `slipway` CLI. It validates input, then starts, signals or queries workflows; the work
 * itself happens in workers.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { Command, CommanderError } from 'commander';
import { CliError, EXIT } from './exit-codes';
import { wholeNumber } from './numbers';
import { PACKAGE_ROOT } from '../lib/package-root';
import { GROUP_DESCRIPTIONS } from './verbs';

/** The release, from package.json (the golden histories of test/histories/ are filed under it too). */
const packageVersion = (JSON.parse(readFileSync(path.join(PACKAGE_ROOT, 'package.json'), 'utf8')) as { version: string }).version;

// Each command's module is required when that command runs, not before: the Temporal client
// alone takes a third of a second to load, and `--help` or `init` need none of it (ADR 0016).
// require(), not import(): it works the same compiled and under tsx from source.
const commands = {
  run: () => require('./commands/run') as typeof import('./commands/run'),
  status: () => require('./commands/status') as typeof import('./commands/status'),
  list: () => require('./commands/list') as typeof import('./commands/list'),
  watch: () => require('./commands/watch') as typeof import('./commands/watch'),
  cancel: () => require('./commands/cancel') as typeof import('./commands/cancel'),
  human: () => require('./commands/human') as typeof import('./commands/human'),
  serve: () => require('./commands/serve') as typeof import('./commands/serve'),
  init: () => require('./commands/init') as typeof import('./commands/init'),
  doctor: () => require('./doctor') as typeof import('./doctor'),
  attach: () => require('./commands/attach') as typeof import('./commands/attach'),
};

type Register = (program: Command, setExit: (code: number) => void) => void;
/** Command groups whose modules register their own subcommands; loaded only when one of their verbs runs. */
export const GROUPS: Array<{ verbs: string[]; register: () => Register }> = [
  // The sandbox service: `sandbox ...` (API client), `api`, `mcp`, and ledger administration.
  { verbs: ['sandbox'], register: () => (require('./commands/sandbox') as typeof import('./commands/sandbox')).registerSandboxCommands },
  { verbs: ['api', 'mcp'], register: () => (require('./commands/api') as typeof import('./commands/api')).registerApiCommands },
  {
    verbs: ['account', 'token', 'project', 'profile', 'usage'],
    register: () => (require('./commands/account') as typeof import('./commands/account')).registerAccountCommands,
  },
  // Spending limits: `budget raise`.
  { verbs: ['budget'], register: () => (require('./commands/budget') as typeof import('./commands/budget')).registerBudgetCommands },
  // Local sandboxes: the janitor's schedule, the prepared template, one stream's work.
  { verbs: ['schedules'], register: () => (require('./commands/schedules') as typeof import('./commands/schedules')).registerSchedulesCommands },
  { verbs: ['template', 'snapshot'], register: () => (require('./commands/template') as typeof import('./commands/template')).registerTemplateCommands },
  { verbs: ['worktree'], register: () => (require('./commands/worktree') as typeof import('./commands/worktree')).registerWorktreeCommands },
  // A repository's own config (.slipway/config.yaml, blueprints) is used only once trusted.
  { verbs: ['trust'], register: () => (require('./commands/trust') as typeof import('./commands/trust')).registerTrustCommand },
  // Encrypted history payloads (SLIPWAY_PAYLOAD_KEY), readable in the Web UI through this.
  { verbs: ['codec-server'], register: () => (require('./commands/codec-server') as typeof import('./commands/codec-server')).registerCodecServerCommand },
];

/** The command word of argv (`slipway help <verb>` names it second), if any. */
export function verbOf(argv: string[]): string | undefined {
  const words = argv.slice(2).filter((a) => !a.startsWith('-'));
  return words[0] === 'help' ? words[1] : words[0];
}

export function buildProgram(argv: string[] = process.argv): Command {
  const program = new Command('slipway')
    .description('Runs AI coding agents in parallel, isolated sandboxes and merges their work, durably on Temporal.')
    .version(packageVersion)
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
    .option('--no-agent-checks', "don't check the agents' executables and credentials on this machine (when the worker is another machine)")
    .action(async (file: string, opts) => setExit(await commands.run().runCommand(file, opts)));

  program
    .command('status')
    .description("show an objective's phase, streams and outcome")
    .argument('<objective-id>')
    .option('--json', 'print JSON')
    .action(async (id: string, opts) => setExit(await commands.status().statusCommand(id, opts)));

  program
    .command('list')
    .description('list objectives (newest first)')
    .option('--json', 'print JSON')
    .option('--limit <n>', 'at most this many', wholeNumber('--limit', { min: 1 }), 50)
    .action(async (opts) => setExit(await commands.list().listCommand(opts)));

  program
    .command('watch')
    .description('follow the live feed of an objective (the newest running one by default) until it ends')
    .option('--objective <id>', 'objective to watch')
    .option('--stream <id>', 'only this stream')
    .option('--agent <name>', 'only this agent mailbox, e.g. builder-api')
    .action(async (opts) => setExit(await commands.watch().watchCommand(opts)));

  program
    .command('cancel')
    .description('stop an objective: its streams are cancelled and cleaned up, what was merged stays on the integration branch')
    .argument('<objective-id>')
    .option('--no-wait', 'return once the cancellation is requested')
    .option('--json', 'print the result as one JSON document on stdout')
    .action(async (id: string, opts) => setExit(await commands.cancel().cancelCommand(id, opts)));

  program
    .command('approve')
    .description('approve the plan an objective is waiting on')
    .argument('<objective-id>')
    .action(async (id: string) => setExit(await commands.human().planDecisionCommand(id, true)));

  program
    .command('reject')
    .description('reject the plan an objective is waiting on; the planner tries again with the reason')
    .argument('<objective-id>')
    .requiredOption('--reason <text>', 'why the plan is rejected')
    .action(async (id: string, opts) => setExit(await commands.human().planDecisionCommand(id, false, opts.reason)));

  const mail = program
    .command('mail')
    .description('escalations waiting for guidance (one per blocked stream), optionally for one agent mailbox')
    .argument('[agent]', 'mailbox, e.g. builder-api')
    .option('--objective <id>', 'only this objective')
    .option('--json', 'print JSON')
    .enablePositionalOptions()
    .action(async (agent: string | undefined, opts) => setExit(await commands.human().mailListCommand(agent, opts)));
  mail
    .command('send')
    .description('send guidance to a blocked stream; its next attempt carries it')
    .argument('<agent>', 'mailbox, e.g. builder-api')
    .argument('<subject>')
    .argument('<body>')
    .requiredOption('--objective <id>', 'objective of the stream')
    .action(async (agent: string, subject: string, body: string, opts) => setExit(await commands.human().mailSendCommand(agent, subject, body, opts)));

  program
    .command('init')
    .description('set a repository up: .slipway/config.yaml and an example objective (gates from its own scripts), then doctor')
    .argument('[path]', 'the repository (default: the current directory)')
    .option('--agent <provider>', 'agent provider; once for every role, twice for builder then reviewer (default claude-code)', collect)
    .option('--gate <name=command>', 'a gate (repeatable); replaces the ones found in package.json scripts', collect)
    .option('--force', 'overwrite an existing setup')
    .option('-y, --yes', 'accept every proposal (init never asks; kept for scripts that pass it)')
    .option('--no-doctor', "skip doctor's findings at the end")
    .action(async (dir: string | undefined, opts) => setExit(await commands.init().initCommand(dir, opts)));

  program
    .command('doctor')
    .description('what can run here (Temporal, git, bubblewrap, pasta, podman, Postgres, agent CLIs and their credentials, disk quotas) and how to install what is missing')
    .option('--json', 'print JSON')
    .action(async (opts) => setExit(await commands.doctor().doctorCommand(opts)));

  program
    .command('attach')
    .description("open a terminal in a stream's sandbox (blocked or running); on exit, commit what changed (as you)")
    .argument('<objective>', 'objective id')
    .argument('<stream>', 'stream id')
    .argument('[command...]', 'what to run (default: bash, or sh)')
    .option('--resume', 'then hand the blocked stream back to the loop (recorded as guidance)')
    .option('-m, --message <text>', 'commit message (and the guidance with --resume)')
    .action(async (objective: string, stream: string, command: string[], opts) => setExit(await commands.attach().attachCommand(objective, stream, { ...opts, command })));

  program
    .command('dev')
    .description('start the embedded Temporal server (Web UI on 8233) and a worker in the foreground')
    .action(async () => setExit(await commands.serve().devCommand()));

  program
    .command('worker')
    .description('run a worker against TEMPORAL_ADDRESS or the running embedded server')
    .option('--id <worker-id>', 'this worker\'s id (default: SLIPWAY_WORKER_ID, else the one kept in $SLIPWAY_HOME/worker-id)')
    .action(async (opts: { id?: string }) => setExit(await commands.serve().workerCommand(opts)));

  // The groups: the one named is registered for real; for help or an unknown word, only their
  // names and descriptions (commander lists them and suggests the nearest).
  const verb = verbOf(argv);
  const group = GROUPS.find((g) => verb !== undefined && g.verbs.includes(verb));
  if (group) group.register()(program, setExit);
  else if (verb === undefined || !program.commands.some((c) => c.name() === verb)) {
    for (const [name, description] of Object.entries(GROUP_DESCRIPTIONS)) program.command(name).description(description);
  }

  return program;
}

const collect = (value: string, previous: string[] = []) => [...previous, value];

function setExit(code: number) {
  process.exitCode = code;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram(argv);
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
    // By name: importing PayloadKeyError's module would load the Temporal SDK for every command.
    if ((e as Error)?.name === 'PayloadKeyError') {
      // Raised while reading settings, before anything starts; the message never holds a key.
      process.stderr.write(`slipway: ${(e as Error).message}\n`);
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
