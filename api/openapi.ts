/**
 * The OpenAPI 3.1 document of the sandbox API, generated from the zod schemas the server
 * validates with. `api/openapi.json` is the committed copy (regenerate: `npm run openapi`);
 * a test fails when the two drift apart.
 */
import { z } from 'zod';
import { CreateSandboxBody, ErrorBody, ExecBody, ExecResult, FileList, GrantIntrospection, MintSshTokenBody, OpenPortBody, PreviewPortList, PreviewPortView, SandboxList, SandboxView, SessionClientFrame, SessionServerFrame, SessionStartFrame, SshTokenView, StreamExecBody } from './schemas';

const schema = (s: z.ZodType, io: 'input' | 'output') => {
  const json = z.toJSONSchema(s, { io, target: 'draft-2020-12', unrepresentable: 'any' }) as Record<string, unknown>;
  delete json.$schema;
  return json;
};

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` });
const json = (name: string) => ({ content: { 'application/json': { schema: ref(name) } } });
const error = (description: string) => ({ description, ...json('Error') });
const ID = { name: 'id', in: 'path', required: true, schema: { type: 'string', pattern: '^sbx_[a-z2-7]{20}$' } };
const PATH = { name: 'path', in: 'path', required: true, description: 'file path relative to the sandbox root; links and ".." may not leave it', schema: { type: 'string' } };
const RETRY_AFTER = { 'Retry-After': { description: 'seconds to wait before trying again', schema: { type: 'integer', minimum: 1 } } };
const tooMany = (description: string) => ({ ...error(description), headers: RETRY_AFTER });
const UNAVAILABLE = { '503': { ...error('the sandbox could not be started or woken right now; try again'), headers: RETRY_AFTER } };
const AUTH_ERRORS = {
  '401': error('missing or invalid token'),
  '403': error('sandboxes are not enabled for the account'),
  '429': tooMany("the account's request rate is exceeded (rate_limited)"),
};
const SANDBOX_ERRORS = {
  '400': error('malformed URL (bad percent-encoding)'),
  ...AUTH_ERRORS,
  '404': error("no such sandbox in this account (another account's is a 404 too)"),
};
/** Optional on create and exec: a retry with the same key gets the first answer, the work is not done twice (24 h). */
const IDEMPOTENCY_KEY = {
  name: 'Idempotency-Key',
  in: 'header',
  required: false,
  description: 'a retry with the same key and body gets the first answer instead of doing the work again (kept 24 hours)',
  schema: { type: 'string', pattern: '^[!-~]{1,200}$' },
} as const;
const CALL_ERRORS = {
  ...SANDBOX_ERRORS,
  '409': error('the sandbox is pending (not_ready) or ended (sandbox_ended; also when its folder or its remote sandbox is gone), or its remote provider cannot do the call in the sandbox\'s state (provider_conflict)'),
  '422': error('the sandbox\'s profile has confinement "none", which this server refuses (unconfined_refused)'),
  '502': error('the remote sandbox provider (Daytona) refused this server\'s credentials or failed the call (provider_error)'),
  '503': { ...error('the sandbox could not be started or woken right now, or its remote provider is rate limiting, out of quota or failing (provider_unavailable); try again'), headers: RETRY_AFTER },
};
const FILE_ERRORS = {
  '400': error('the path leaves the sandbox, names .git or .slipway, has a component over 255 bytes, is a hard link, a directory or not a regular file, or the remote provider refused it (provider_refused, with the provider\'s reason)'),
  '413': error('the file is larger than the server\'s file limit (file_too_large, too_large)'),
};

export function buildOpenApiDocument() {
  return {
    openapi: '3.1.0',
    info: {
      title: 'Slipway sandbox API',
      version: '1.0.0',
      description:
        'Account-scoped sandboxes: create with a profile, exec and edit files in a tight loop, destroy. ' +
        'Idle sandboxes suspend themselves (snapshot stored, compute released) and wake on the next exec or file call. ' +
        'Every billable interval is recorded in the sandbox_sessions table.',
    },
    servers: [{ url: '/' }],
    security: [{ bearer: [] }],
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer', description: 'an account API token (`slipway token create`)' } },
      schemas: {
        CreateSandbox: schema(CreateSandboxBody, 'input'),
        Exec: schema(ExecBody, 'input'),
        StreamExec: schema(StreamExecBody, 'input'),
        SessionStartFrame: schema(SessionStartFrame, 'input'),
        SessionClientFrame: schema(SessionClientFrame, 'input'),
        SessionFrame: schema(SessionServerFrame, 'output'),
        ExecResult: schema(ExecResult, 'output'),
        OpenPort: schema(OpenPortBody, 'input'),
        PreviewPort: schema(PreviewPortView, 'output'),
        PreviewPortList: schema(PreviewPortList, 'output'),
        MintSshToken: schema(MintSshTokenBody, 'input'),
        SshToken: schema(SshTokenView, 'output'),
        Sandbox: schema(SandboxView, 'output'),
        SandboxList: schema(SandboxList, 'output'),
        GrantIntrospection: schema(GrantIntrospection, 'output'),
        FileList: schema(FileList, 'output'),
        Error: schema(ErrorBody, 'output'),
      },
    },
    paths: {
      '/api/v1/sandboxes': {
        post: {
          operationId: 'createSandbox',
          summary: 'Create a sandbox (status pending; poll GET until ready)',
          parameters: [IDEMPOTENCY_KEY],
          requestBody: { required: true, ...json('CreateSandbox') },
          responses: {
            '201': { description: 'created, pending (or, for a repeated Idempotency-Key, the sandbox the first request created, with header idempotent-replayed: true)', ...json('Sandbox') },
            '400': error('malformed body or Idempotency-Key'),
            '409': error('a request with this Idempotency-Key is still being served (idempotent_request_in_progress); retry'),
            ...AUTH_ERRORS,
            '413': error('the request body is too large'),
            '422': error('unknown profile, deadline over the profile maximum, a grant on a project of another account, a profile with confinement "none" on a server that refuses it (unconfined_refused), or an Idempotency-Key used with another body (idempotency_key_reused)'),
            '429': tooMany("the account's concurrency limit is reached"),
            ...UNAVAILABLE,
          },
        },
        get: {
          operationId: 'listSandboxes',
          summary: "List the account's sandboxes, newest first",
          parameters: [
            { name: 'status', in: 'query', schema: { type: 'string' } },
            { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 500, default: 100 } },
          ],
          responses: { '200': { description: 'sandboxes', ...json('SandboxList') }, '400': error('malformed query (status, limit)'), ...AUTH_ERRORS },
        },
      },
      '/api/v1/sandboxes/{id}': {
        get: {
          operationId: 'getSandbox',
          summary: 'Get one sandbox',
          parameters: [ID, { name: 'wait_ready_seconds', in: 'query', description: 'long-poll while pending', schema: { type: 'number', minimum: 0, maximum: 300 } }],
          responses: { '200': { description: 'the sandbox', ...json('Sandbox') }, ...SANDBOX_ERRORS, '400': error('malformed URL or query (wait_ready_seconds)') },
        },
        delete: {
          operationId: 'destroySandbox',
          summary: 'Destroy a sandbox (asynchronous: it moves to terminating, then terminated)',
          parameters: [ID],
          responses: { '202': { description: 'termination requested', ...json('Sandbox') }, ...SANDBOX_ERRORS },
        },
      },
      '/api/v1/sandboxes/{id}/exec': {
        post: {
          operationId: 'execInSandbox',
          summary: 'Run a command in the sandbox and wait for it (wakes a suspended sandbox first)',
          description:
            'No shell: `command` is a program name (looked up on PATH) or path, without "=" or NUL; arguments go in `args` (use "sh" with ["-c", "..."] for a shell). ' +
            "The environment is PATH, LANG, HOME, SLIPWAY_* and `env`, never the server's; values travel in the process environment, not argv. " +
            'A caller that disconnects before the answer kills the command.',
          parameters: [ID, IDEMPOTENCY_KEY],
          requestBody: { required: true, content: { 'application/json': { schema: { oneOf: [ref('Exec'), ref('StreamExec')] } } } },
          responses: {
            '200': {
              description:
                'the finished command (for a repeated Idempotency-Key, the first run\'s answer, with header idempotent-replayed: true); ' +
                'with `stream: true`, NDJSON: one SessionFrame per line as the output comes (stdout, stderr), the exit frame last. The output is read from the command only as fast as the client reads (back-pressure); no Idempotency-Key with stream.',
              content: { 'application/json': { schema: ref('ExecResult') }, 'application/x-ndjson': { schema: ref('SessionFrame') } },
            },
            ...CALL_ERRORS,
            '400': error('malformed URL or body, or a cwd that leaves the sandbox or is not an existing folder (invalid_cwd)'),
            '413': error('the request body is too large'),
            '429': tooMany('the account runs as many execs at once as it may (exec_limit)'),
          },
        },
      },
      '/api/v1/sandboxes/{id}/exec/ws': {
        get: {
          operationId: 'execSessionWebSocket',
          summary: 'An interactive session over a WebSocket (a shell, a terminal)',
          description:
            'Upgrade to a WebSocket (bearer token in the Authorization header; checked, with the sandbox, before the upgrade). ' +
            'First message: a SessionStartFrame (JSON text). Then binary messages are stdin bytes; text messages are SessionClientFrames (stdin as base64, stdin_close, resize, signal). ' +
            'The server sends SessionFrames (stdout, stderr, then exit) and closes with 1000. A bad start frame gets an error frame naming the field and a close with 4000 + the HTTP status (4400, 4409, 4429); ' +
            'a bad later frame gets an error frame and the session goes on. Under a pty, SIGINT/SIGQUIT/SIGTSTP are typed as ^C ^\\ ^Z. The session is activity for idle suspend until it ends; a closed socket kills it.',
          parameters: [ID],
          responses: { '101': { description: 'switching protocols' }, ...SANDBOX_ERRORS, '426': error('a plain GET without the WebSocket upgrade (upgrade_required)') },
        },
      },
      '/api/v1/sandboxes/{id}/files': {
        get: {
          operationId: 'listSandboxFiles',
          summary: 'List a folder (its entries by name; .git and .slipway left out; links not followed)',
          parameters: [ID, { name: 'path', in: 'query', required: false, description: 'the folder, relative to the sandbox root (default: the root); links and ".." may not leave it', schema: { type: 'string', minLength: 1, default: '.' } }],
          responses: {
            '200': { description: 'the folder\'s entries', ...json('FileList') },
            ...CALL_ERRORS,
            '400': error('the path leaves the sandbox, names .git or .slipway, has a component over 255 bytes, or is not a folder (not_a_directory)'),
          },
        },
      },
      '/api/v1/sandboxes/{id}/files/{path}': {
        get: {
          operationId: 'readSandboxFile',
          summary: 'Read a file (raw bytes)',
          parameters: [ID, PATH],
          responses: {
            '200': { description: 'file content', content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
            ...CALL_ERRORS,
            ...FILE_ERRORS,
          },
        },
        put: {
          operationId: 'writeSandboxFile',
          summary: 'Write a file (raw bytes; parent folders are created)',
          parameters: [ID, PATH],
          requestBody: { required: true, content: { 'application/octet-stream': { schema: { type: 'string', format: 'binary' } } } },
          responses: { '204': { description: 'written' }, ...CALL_ERRORS, ...FILE_ERRORS, '507': error('no space left for the file') },
        },
        delete: {
          operationId: 'deleteSandboxFile',
          summary: 'Delete a file (a link is removed, never its target)',
          parameters: [ID, PATH],
          responses: { '204': { description: 'deleted' }, ...CALL_ERRORS, '400': FILE_ERRORS['400'] },
        },
      },
      '/api/v1/sandboxes/{id}/ports': {
        post: {
          operationId: 'openSandboxPort',
          summary: 'Expose a port a process in the sandbox listens on at a preview origin (ADR 0015)',
          description:
            'The preview is served by this server at `http://<id without sbx_>-<port>.<preview domain>:<this port>/` (its own origin), to the account token (Authorization: Bearer) ' +
            'or a signed, short-lived link (`?slipway_preview=...`, answered with 303 and a host-only cookie). HTTP and WebSockets are proxied into the sandbox\'s own network: ' +
            'the port is reached as 127.0.0.1:<port> inside the sandbox, never on the host. It answers while a command of the sandbox listens there (else 502). ' +
            'Opening an open port again returns a fresh link.',
          parameters: [ID],
          requestBody: { required: true, ...json('OpenPort') },
          responses: {
            '201': { description: 'the open port, its URL and a signed link', ...json('PreviewPort') },
            ...SANDBOX_ERRORS,
            '400': error('malformed URL or body (port 1 to 65535, link_ttl_seconds up to 86400)'),
            '404': error("no such sandbox in this account (another account's is a 404 too), or preview ports are off on this server (previews_off)"),
            '409': error('the sandbox ended (sandbox_ended)'),
            '422': error('the sandbox is not confined: it has no network of its own (preview_needs_confinement)'),
          },
        },
        get: {
          operationId: 'listSandboxPorts',
          summary: 'The open preview ports, each with a fresh signed link',
          parameters: [ID],
          responses: {
            '200': { description: 'open ports', ...json('PreviewPortList') },
            ...SANDBOX_ERRORS,
            '404': error("no such sandbox in this account (another account's is a 404 too), or preview ports are off on this server (previews_off)"),
          },
        },
      },
      '/api/v1/sandboxes/{id}/ports/{port}': {
        delete: {
          operationId: 'closeSandboxPort',
          summary: 'Close a preview port: its URL and links stop working',
          parameters: [ID, { name: 'port', in: 'path', required: true, schema: { type: 'integer', minimum: 1, maximum: 65535 } }],
          responses: { '204': { description: 'closed' }, ...SANDBOX_ERRORS, '400': error('the port is not a number from 1 to 65535'), '404': error('no such sandbox, or the port is not open (port_not_open)') },
        },
      },
      '/api/v1/sandboxes/{id}/ssh_tokens': {
        post: {
          operationId: 'mintSshToken',
          summary: 'Mint a short-lived SSH credential bound to this sandbox (ADR 0015)',
          description:
            'The token is shown once and stored hashed. Log in with `ssh -p <port> <token>@<host>`, or as user `<sandbox id>` with the token as password. ' +
            'Sessions run in the sandbox under its confinement: exec, shells with a PTY, and SFTP (scp, sftp, VS Code Remote-SSH). No port forwarding.',
          parameters: [ID],
          requestBody: { required: false, ...json('MintSshToken') },
          responses: {
            '201': { description: 'the token and how to use it', ...json('SshToken') },
            ...SANDBOX_ERRORS,
            '400': error("malformed URL or body, or ttl_minutes over the server's maximum"),
            '404': error("no such sandbox in this account (another account's is a 404 too), or the SSH broker is off on this server (ssh_off)"),
            '409': error('the sandbox ended (sandbox_ended)'),
          },
        },
      },
      '/api/v1/sandboxes/{id}/ssh_tokens/{tokenId}': {
        delete: {
          operationId: 'revokeSshToken',
          summary: 'Revoke an SSH token: no new login or channel with it',
          parameters: [ID, { name: 'tokenId', in: 'path', required: true, schema: { type: 'string' } }],
          responses: { '204': { description: 'revoked' }, ...SANDBOX_ERRORS, '404': error('no such sandbox, or no live token with that id for it') },
        },
      },
      '/api/v1/grants/introspect': {
        get: {
          operationId: 'introspectGrant',
          summary: "Inside a sandbox: what a grant token (from .slipway/grants.json) allows; bearer = the grant token",
          responses: { '200': { description: 'the grant', ...json('GrantIntrospection') }, '401': error('invalid, expired or revoked grant token') },
        },
      },
    },
  };
}
