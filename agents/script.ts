/**
 * The `script` provider: a deterministic shell command run in the sandbox, prompt on stdin,
 * context in SLIPWAY_* environment variables. Each output line is plain text; a line with
 * `<session>ID</session>` reports a session id (lets scripts exercise session resume).
 */
import type { AgentProvider } from './provider';

const SESSION_TAG = /<session>([^<]+)<\/session>/;

export const scriptProvider: AgentProvider = {
  kind: 'script',
  buildCommand(invocation) {
    if (!invocation.spec.command) throw new Error('script agent needs a command');
    return {
      command: invocation.spec.command,
      args: [],
      shell: true,
      stdin: invocation.prompt,
      env: invocation.resumeSessionId ? { SLIPWAY_RESUME_SESSION: invocation.resumeSessionId } : undefined,
    };
  },
  parseLine(line, stream) {
    if (stream === 'stderr') return [];
    const session = SESSION_TAG.exec(line);
    return session ? [{ type: 'session', sessionId: session[1] }, { type: 'text', text: line }] : [{ type: 'text', text: line }];
  },
};
