/**
 * `slipway attach <objective> <stream>`: a human opens a terminal in a stream's sandbox, under
 * the same confinement as its agent (ADR 0014), works there, and on exit Slipway commits what
 * changed through the loop's own commitWork (the repository's identity, i.e. the human's), and
 * with `--resume` hands the blocked stream back to the loop as guidance (in the ledger).
 */
import { createActivities, defaultActivityDeps } from '../../activities';
import { LocalSandboxProvider } from '../../activities/sandbox/local';
import type { SandboxSession } from '../../activities/sandbox/provider';
import { streamWorkflowId } from '../../core/ids';
import type { StreamPhase } from '../../core/states';
import { guidanceUpdate, streamStatusQuery } from '../../workflows/stream';
import { CliError, EXIT } from '../exit-codes';
import { openRuntime } from '../runtime';
import { exitStatus, runTerminal, terminalSize, type RemoteTerminal } from '../terminal';
import { objectiveStatus, updateError } from './human';
import { DEFAULT_SHELL } from './sandbox';

/** Phases in which the stream's sandbox is there to work in. */
const ATTACHABLE: StreamPhase[] = ['blocked', 'building', 'gates', 'reviewing', 'scouting', 'rate_limited', 'merge_ready'];

/** A local session as the CLI's terminal sees it. */
export function sessionTerminal(session: SandboxSession): RemoteTerminal {
  session.stdout.pipe(process.stdout, { end: false });
  session.stderr.pipe(process.stderr, { end: false });
  const drained = Promise.all([session.stdout, session.stderr].map((s) => new Promise<void>((resolve) => (s.readableEnded ? resolve() : s.once('close', resolve)))));
  return {
    write: (bytes) => void session.stdin.write(bytes),
    resize: (cols, rows) => session.resize(cols, rows),
    interrupt: () => session.signal('SIGINT'),
    exit: Promise.all([session.exit, drained]).then(([e]) => exitStatus(e.exitCode, e.signal)),
  };
}

export async function attachCommand(objectiveId: string, streamId: string, opts: { resume?: boolean; message?: string; command?: string[] }): Promise<number> {
  const runtime = await openRuntime({ startIfMissing: false });
  try {
    const status = await objectiveStatus(runtime.client, objectiveId);
    if (!status.streams.some((s) => s.id === streamId)) throw new CliError(`no stream "${streamId}" in objective ${objectiveId} (streams: ${status.streams.map((s) => s.id).join(', ')})`);
    // The stream's own record names its sandbox (Slipway's record, never the sandbox's files).
    const view = await runtime.client.workflow.getHandle(streamWorkflowId(objectiveId, streamId)).query(streamStatusQuery);
    if (!ATTACHABLE.includes(view.phase)) throw new CliError(`stream "${streamId}" is ${view.phase}; attach needs a blocked or running stream`);
    if (opts.resume && view.phase !== 'blocked') throw new CliError(`--resume needs a blocked stream; "${streamId}" is ${view.phase}`);
    if (!view.sandboxPath) throw new CliError(`stream "${streamId}" has no sandbox yet`);
    const root = view.sandboxPath;

    const [command, ...args] = opts.command && opts.command.length > 0 ? opts.command : DEFAULT_SHELL;
    const session = await new LocalSandboxProvider().openSession({ root }, { command: command!, args, pty: terminalSize() });
    process.stderr.write(`slipway: attached to ${objectiveId}/${streamId} (exit the shell to commit${opts.resume ? ' and resume the stream' : ''})\r\n`);
    await runTerminal(sessionTerminal(session));

    const message = opts.message?.trim() || `Work by hand in stream ${streamId} (slipway attach)`;
    const { head, committed } = await createActivities(defaultActivityDeps()).commitWork({ path: root, message });
    process.stdout.write(committed ? `committed ${head.slice(0, 12)} on ${view.branch}\n` : `nothing changed; ${view.branch} stays at ${head.slice(0, 12)}\n`);
    if (opts.resume) {
      const ack = await runtime.client.workflow
        .getHandle(streamWorkflowId(objectiveId, streamId))
        .executeUpdate(guidanceUpdate, {
          args: [{ agent: streamId, subject: 'slipway attach', body: `${message}\nA human worked in the sandbox${committed ? ` and committed ${head}` : ''}; build on their changes, keep them.` }],
        })
        .catch(updateError);
      process.stdout.write(`stream ${ack.streamId} resumes at step ${ack.resumesAt}\n`);
    }
    return EXIT.ok;
  } finally {
    await runtime.close();
  }
}
