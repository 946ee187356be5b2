/**
 * Request and response shapes of the sandbox REST API, defined once in zod: the server
 * validates with them, the OpenAPI document is generated from them, the MCP tools reuse them.
 */
import { z } from 'zod';
import { SANDBOX_STATES } from '../core/states';
import { DEFAULT_LINK_TTL_SECONDS, MAX_LINK_TTL_SECONDS, MAX_PREVIEW_PORT, MIN_PREVIEW_PORT } from '../activities/service/preview';
import { END_REASONS, PLATFORMS, PROVISIONING_KINDS, SANDBOX_ID_PATTERN } from '../core/sandbox-service';

export const SandboxIdSchema = z.string().regex(SANDBOX_ID_PATTERN, 'must be a sandbox id (sbx_ followed by 20 characters)');

const SCOPE = /^[a-z][a-z0-9_.:-]{0,63}$/;
export const GrantSchema = z.strictObject({
  project_id: z.uuid().describe('a project of this account (`slipway project create`)'),
  scopes: z.array(z.string().regex(SCOPE, 'scopes are lowercase words such as "cache:read"')).min(1).max(16).describe('what the grant token allows, e.g. ["cache:read"]'),
});

/** NUL cannot reach a process (argv, environment) nor Postgres: refused up front, by field. */
const NO_NUL = /^[^\u0000]*$/;
const noNul = (max: number) => z.string().max(max).regex(NO_NUL, 'may not contain NUL');

export const CreateSandboxBody = z.strictObject({
  profile: noNul(100).min(1).describe('profile name, e.g. "linux-medium"; implies provider, platform and resources'),
  deadline_minutes: z.number().positive().max(7 * 24 * 60).optional().describe("minutes the sandbox may stay up while not suspended (default: the profile's)"),
  project_id: z.uuid().optional().describe('reporting tag only; no access implications'),
  grants: z.array(GrantSchema).max(16).default([]).describe('scoped, short-lived tokens minted for the sandbox and written to .slipway/grants.json inside it'),
});
export type CreateSandboxBody = z.infer<typeof CreateSandboxBody>;

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
export const ExecBody = z.strictObject({
  command: z
    .string()
    .min(1)
    .max(4096)
    // A pattern rather than a refinement, so the OpenAPI document states the rule too.
    .regex(/^[^=\u0000]+$/, 'must be a program name or path (no "=" or NUL); use args for arguments')
    .describe('program to run, a name looked up on PATH or a path (no "=" or NUL; no shell: use "sh" with args ["-c", "..."] for one)'),
  args: z.array(noNul(128 * 1024)).max(4096).default([]).describe('arguments, passed as they are (no shell expansion)'),
  env: z
    .record(z.string().regex(ENV_NAME, 'environment names are letters, digits and "_"'), noNul(128 * 1024))
    .default({})
    .describe("the command's environment is this plus PATH, HOME, LANG and SLIPWAY_* (never the server's)"),
  stdin: z.string().max(16 * 1024 * 1024).optional().describe("text fed to the command's standard input"),
  cwd: z.string().max(4096).optional().describe('working directory relative to the sandbox root; must be an existing folder inside it'),
  timeout_seconds: z.number().positive().max(3600).default(300).describe('the command (and its process group) is killed after this many seconds; timed_out says so'),
});
export type ExecBody = z.infer<typeof ExecBody>;

export const PtySize = z.strictObject({
  cols: z.number().int().min(1).max(10_000),
  rows: z.number().int().min(1).max(10_000),
});
export const OutputEncoding = z.enum(['utf8', 'base64']).describe('how output chunks travel in frames: utf8 text (split only between characters) or base64 bytes; default utf8');

/** POST /exec with `stream: true`: the exec body plus how the output travels (ADR 0014). */
export const StreamExecBody = ExecBody.extend({
  stream: z.literal(true).describe('answer with NDJSON frames as the output comes ({"type":"stdout"|"stderr","data":...} then {"type":"exit",...})'),
  pty: PtySize.optional().describe('run under a terminal of this size inside the sandbox (stdout and stderr merged)'),
  output_encoding: OutputEncoding.optional(),
});
export type StreamExecBody = z.infer<typeof StreamExecBody>;

/** The first message on the exec WebSocket: what to run (secrets travel here, never in the URL). */
export const SessionStartFrame = z.strictObject({
  type: z.literal('start'),
  command: ExecBody.shape.command,
  args: ExecBody.shape.args,
  env: ExecBody.shape.env,
  cwd: ExecBody.shape.cwd,
  pty: PtySize.optional(),
  output_encoding: OutputEncoding.optional(),
});
export type SessionStartFrame = z.infer<typeof SessionStartFrame>;

/** Later client messages on the exec WebSocket (binary messages are stdin bytes as they are). */
export const SessionClientFrame = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('stdin'), data: z.string().max(1024 * 1024).describe('base64 bytes for the command\'s input') }),
  z.strictObject({ type: z.literal('stdin_close') }),
  z.strictObject({ type: z.literal('resize'), cols: PtySize.shape.cols, rows: PtySize.shape.rows }),
  z.strictObject({ type: z.literal('signal'), signal: z.enum(['SIGINT', 'SIGQUIT', 'SIGTSTP', 'SIGTERM', 'SIGHUP', 'SIGKILL', 'SIGUSR1', 'SIGUSR2', 'SIGCONT', 'SIGWINCH']) }),
]);
export type SessionClientFrame = z.infer<typeof SessionClientFrame>;

/** What the server sends on the stream (NDJSON lines) and the WebSocket (text messages). */
export const SessionServerFrame = z.discriminatedUnion('type', [
  z.object({ type: z.literal('stdout'), data: z.string() }),
  z.object({ type: z.literal('stderr'), data: z.string() }),
  z.object({ type: z.literal('exit'), exit_code: z.number().int().nullable(), signal: z.string().nullable(), timed_out: z.boolean(), duration_ms: z.number() }),
  z.object({ type: z.literal('error'), code: z.string(), message: z.string(), issues: z.array(z.object({ path: z.string(), message: z.string() })).optional() }),
]);
export type SessionServerFrame = z.infer<typeof SessionServerFrame>;

export const ExecResult = z.object({
  exit_code: z.number().int().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  timed_out: z.boolean(),
  duration_ms: z.number(),
});

export const ListQuery = z.strictObject({
  status: z.enum(SANDBOX_STATES).optional(),
  limit: z.coerce.number().int().positive().max(500).default(100),
});

export const GetQuery = z.strictObject({
  wait_ready_seconds: z.coerce.number().min(0).max(300).optional().describe('long-poll: wait up to this long while the sandbox is pending'),
});

export const ListFilesQuery = z.strictObject({
  path: z.string().min(1).default('.').describe('the folder, relative to the sandbox root (default: the root); links and ".." may not leave it'),
});

/** Most entries one listing returns (a sandbox's folder may hold any number; the answer stays bounded). */
export const MAX_LISTED_FILES = 10_000;

export const FileList = z.object({
  path: z.string(),
  entries: z.array(
    z.object({
      name: z.string(),
      type: z.enum(['file', 'directory', 'symlink', 'other']).describe('what the entry is (a link is not followed)'),
      size: z.number().int().describe('bytes'),
    }),
  ),
  truncated: z.boolean().describe(`true when the folder holds more than ${MAX_LISTED_FILES} entries (the first by name are listed)`),
});
export type FileList = z.infer<typeof FileList>;

export const SandboxView = z.object({
  id: z.string(),
  status: z.enum(SANDBOX_STATES),
  profile: z.string(),
  platform: z.enum(PLATFORMS),
  project_id: z.string().nullable(),
  provisioning_kind: z.enum(PROVISIONING_KINDS).nullable(),
  created_at: z.string(),
  ready_at: z.string().nullable(),
  suspended_at: z.string().nullable(),
  terminated_at: z.string().nullable(),
  deadline_at: z.string().nullable().describe('null while suspended: the deadline clock is paused'),
  deadline_remaining_seconds: z.number().nullable(),
  cap_at: z.string(),
  end_reason: z.enum(Object.keys(END_REASONS) as [keyof typeof END_REASONS, ...Array<keyof typeof END_REASONS>]).nullable(),
  error: z.string().nullable(),
  ssh_endpoint: z.null(),
  grants: z.array(z.object({ project_id: z.string(), scopes: z.array(z.string()) })),
  grants_file: z.string().nullable(),
});
export type SandboxView = z.infer<typeof SandboxView>;

export const SandboxList = z.object({ sandboxes: z.array(SandboxView) });

export const OpenPortBody = z.strictObject({
  port: z.number().int().min(MIN_PREVIEW_PORT).max(MAX_PREVIEW_PORT).describe('the port a process in the sandbox listens on (127.0.0.1 or all addresses inside the sandbox)'),
  link_ttl_seconds: z
    .number()
    .int()
    .min(1)
    .max(MAX_LINK_TTL_SECONDS)
    .optional()
    .describe(`how long the signed link in the answer stays valid (default ${DEFAULT_LINK_TTL_SECONDS})`),
});
export type OpenPortBody = z.infer<typeof OpenPortBody>;

export const PreviewPortView = z.object({
  port: z.number(),
  opened_at: z.string(),
  url: z.string().describe('the preview origin; needs Authorization: Bearer <account token>, or the signed link once'),
  link: z.string().describe('a signed, short-lived URL for a browser: its first use sets a cookie of the preview origin'),
  link_expires_at: z.string(),
});
export type PreviewPortView = z.infer<typeof PreviewPortView>;
export const PreviewPortList = z.object({ ports: z.array(PreviewPortView) });

export const MintSshTokenBody = z.strictObject({
  ttl_minutes: z.number().int().min(1).max(7 * 24 * 60).optional().describe("how long the token opens SSH sessions (default 60; at most the server's --ssh-max-token-minutes)"),
});
export type MintSshTokenBody = z.infer<typeof MintSshTokenBody>;

export const SshTokenView = z.object({
  token_id: z.string().describe('for DELETE .../ssh_tokens/{token_id}'),
  token: z.string().describe('shown once; stored hashed'),
  host: z.string(),
  port: z.number(),
  user: z.string().describe('the token itself: `ssh -p PORT TOKEN@HOST`'),
  password_user: z.string().describe('or log in as the sandbox id with the token as the password (keeps the token out of argv)'),
  command: z.string().describe('what to type'),
  expires_at: z.string(),
});
export type SshTokenView = z.infer<typeof SshTokenView>;

export const ErrorBody = z.object({
  error: z.object({
    code: z.string(),
    message: z.string(),
    issues: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
  }),
});

export const GrantIntrospection = z.object({
  grant_id: z.string(),
  sandbox_id: z.string(),
  project_id: z.string(),
  scopes: z.array(z.string()),
  expires_at: z.string(),
});

/** "a.b[0].c: message" lines for a zod error: the clear 4xx the API promises. */
export function zodIssues(error: z.ZodError): Array<{ path: string; message: string }> {
  return error.issues.map((i) => ({ path: i.path.map(String).join('.') || '(body)', message: i.message }));
}
