/**
 * A fake model endpoint for the real agent CLIs (test/real-agents.e2e.test.ts). It speaks the three
 * wire formats the CLIs use: Anthropic Messages (`POST /v1/messages`, streaming or not; Claude
 * Code and Pi), OpenAI Responses (`POST /v1/responses`, streaming; Codex) and OpenAI Chat
 * Completions (`POST /v1/chat/completions`, streaming; OpenCode through its openai-compatible
 * provider). It listens on a Unix socket: the CLIs run in a network namespace of their own with
 * only a loopback device (test/fixtures/agents/offline.mjs), and that wrapper forwards its
 * 127.0.0.1 port to the socket, tagging each request with the run it belongs to.
 *
 * What it answers, from the conversation (never from a script of calls, so retries and side
 * requests such as title generation just work):
 * - a request without tools: a short text (titles, summaries);
 * - a reviewer's prompt (it asks for `<review>`): an approving verdict;
 * - a builder's prompt: the file named by the LAST `WRITE:<name>` of its latest prompt, written with
 *   the CLI's own write tool; once that tool's result is in the conversation, a final text with the
 *   completion signal.
 * Every response reports the same usage (`USAGE`), so the test can check the figures each run
 * reports against the requests the endpoint served for that run.
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';

export const USAGE = { input: 1000, output: 200 } as const;

export interface ServedRequest {
  /** The run (one offline.mjs process) it came from, and the cwd and PWD that process had. */
  run: string;
  cwd: string;
  pwd: string;
  path: string;
  model?: string;
  /** Whether it carried the expected API key (header), and what it answered. */
  keyOk: boolean;
  answer: 'text' | 'tool' | 'final' | 'review' | 'unknown';
  /** Files this endpoint's earlier final answers in the conversation say were written ("Wrote hello.txt."): the session's earlier turns. */
  earlierFinals: string[];
  usage?: { input: number; output: number };
}

interface View {
  hasTools: boolean;
  toolNames: string[];
  /** Text of the latest user message that holds text (the prompt of this run). */
  prompt: string;
  /** A tool result came after that prompt. */
  toolResultSince: boolean;
  /** The system prompt, for the working directory Claude Code states there. */
  system: string;
}

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const textOf = (content: unknown): string => {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((b: Json) => (typeof b?.text === 'string' ? b.text : ''))
    .filter(Boolean)
    .join('\n');
};

function anthropicView(body: Json): View {
  const messages: Json[] = Array.isArray(body.messages) ? body.messages : [];
  let prompt = '';
  let toolResultSince = false;
  for (const m of messages) {
    if (m.role !== 'user') continue;
    const blocks: Json[] = Array.isArray(m.content) ? m.content : [{ type: 'text', text: String(m.content ?? '') }];
    if (blocks.some((b) => b.type === 'tool_result')) toolResultSince = true;
    else if (blocks.some((b) => b.type === 'text' && b.text.trim())) {
      prompt = textOf(blocks);
      toolResultSince = false;
    }
  }
  const tools: Json[] = Array.isArray(body.tools) ? body.tools : [];
  return { hasTools: tools.length > 0, toolNames: tools.map((t) => t.name), prompt, toolResultSince, system: textOf(body.system) };
}

function responsesView(body: Json): View {
  const input: Json[] = Array.isArray(body.input) ? body.input : [];
  let prompt = '';
  let toolResultSince = false;
  for (const item of input) {
    if (/_call_output$/.test(String(item.type))) toolResultSince = true;
    else if ((item.type === 'message' || item.type === undefined) && item.role === 'user') {
      const text = textOf(item.content);
      // Codex sends its environment context and AGENTS.md as user messages too: only a prompt with our task counts.
      if (text.trim() && !/^<(environment_context|user_instructions)/.test(text.trim())) {
        prompt = text;
        toolResultSince = false;
      }
    }
  }
  const tools: Json[] = Array.isArray(body.tools) ? body.tools : [];
  return { hasTools: tools.length > 0, toolNames: tools.map((t) => t.name ?? t.type), prompt, toolResultSince, system: String(body.instructions ?? '') };
}

function chatView(body: Json): View {
  const messages: Json[] = Array.isArray(body.messages) ? body.messages : [];
  let prompt = '';
  let toolResultSince = false;
  let system = '';
  for (const m of messages) {
    if (m.role === 'system') system += textOf(m.content);
    if (m.role === 'tool') toolResultSince = true;
    if (m.role === 'user' && textOf(m.content).trim()) {
      prompt = textOf(m.content);
      toolResultSince = false;
    }
  }
  const tools: Json[] = Array.isArray(body.tools) ? body.tools : [];
  return { hasTools: tools.length > 0, toolNames: tools.map((t) => t.function?.name ?? t.name), prompt, toolResultSince, system };
}

type Decision =
  | { answer: 'text' | 'final' | 'review' | 'unknown'; text: string }
  | { answer: 'tool'; tool: string; args: Json };

export const REVIEW_APPROVE = '<review>{"verdict":"approve","summary":"the file is there","findings":[]}</review>';

function decide(view: View, cwd: string): Decision {
  if (!view.hasTools) return { answer: 'text', text: 'Fake title' };
  if (/<review>/.test(view.prompt)) return { answer: 'review', text: REVIEW_APPROVE };
  const names = [...view.prompt.matchAll(/WRITE:([\w.-]+)/g)].map((m) => m[1]);
  const file = names.at(-1);
  if (!file) return { answer: 'unknown', text: 'Nothing to do. <promise>COMPLETE</promise>' };
  if (view.toolResultSince) return { answer: 'final', text: `Wrote ${file}. <promise>COMPLETE</promise>` };
  const content = `written by the agent for ${file}\n`;
  const has = (n: string) => view.toolNames.includes(n);
  // Claude Code's Write wants an absolute path: the working directory it states in its system prompt, else the run's cwd.
  if (has('Write')) {
    const dir = /working directory: (\S+)/i.exec(view.system)?.[1] ?? cwd;
    return { answer: 'tool', tool: 'Write', args: { file_path: `${dir}/${file}`, content } };
  }
  if (has('write')) return { answer: 'tool', tool: 'write', args: { path: file, filePath: `${cwd}/${file}`, content } };
  if (has('apply_patch')) return { answer: 'tool', tool: 'apply_patch', args: { input: `*** Begin Patch\n*** Add File: ${file}\n+${content.trimEnd()}\n*** End Patch\n` } };
  for (const shell of ['shell', 'shell_command', 'exec_command', 'bash']) {
    if (has(shell)) return { answer: 'tool', tool: shell, args: { command: `printf '%s' '${content.trimEnd()}' > ${file}`, cmd: `printf '%s\\n' '${content.trimEnd()}' > ${file}` } };
  }
  return { answer: 'unknown', text: `no write tool among: ${view.toolNames.join(', ')}` };
}

function sse(res: ServerResponse, events: Array<{ event?: string; data: unknown }>): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  for (const e of events) res.write(`${e.event ? `event: ${e.event}\n` : ''}data: ${typeof e.data === 'string' ? e.data : JSON.stringify(e.data)}\n\n`);
  res.end();
}

function anthropicReply(res: ServerResponse, body: Json, d: Decision): void {
  const id = `msg_${randomUUID().replace(/-/g, '').slice(0, 24)}`;
  const usageStart = { input_tokens: USAGE.input, output_tokens: 1, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 };
  const block = d.answer === 'tool' ? { type: 'tool_use', id: `toolu_${randomUUID().replace(/-/g, '').slice(0, 24)}`, name: d.tool, input: d.args } : { type: 'text', text: d.text };
  const stop = d.answer === 'tool' ? 'tool_use' : 'end_turn';
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ id, type: 'message', role: 'assistant', model: body.model, content: [block], stop_reason: stop, stop_sequence: null, usage: { ...usageStart, output_tokens: USAGE.output } }));
    return;
  }
  const events: Array<{ event: string; data: unknown }> = [
    { event: 'message_start', data: { type: 'message_start', message: { id, type: 'message', role: 'assistant', model: body.model, content: [], stop_reason: null, stop_sequence: null, usage: usageStart } } },
  ];
  if (block.type === 'tool_use') {
    events.push(
      { event: 'content_block_start', data: { type: 'content_block_start', index: 0, content_block: { ...block, input: {} } } },
      { event: 'content_block_delta', data: { type: 'content_block_delta', index: 0, delta: { type: 'input_json_delta', partial_json: JSON.stringify(block.input) } } },
    );
  } else {
    events.push(
      { event: 'content_block_start', data: { type: 'content_block_start', index: 0, content_block: { type: 'text', text: '' } } },
      { event: 'content_block_delta', data: { type: 'content_block_delta', index: 0, delta: { type: 'text_delta', text: block.text } } },
    );
  }
  events.push(
    { event: 'content_block_stop', data: { type: 'content_block_stop', index: 0 } },
    { event: 'message_delta', data: { type: 'message_delta', delta: { stop_reason: stop, stop_sequence: null }, usage: { output_tokens: USAGE.output } } },
    { event: 'message_stop', data: { type: 'message_stop' } },
  );
  sse(res, events);
}

function responsesReply(res: ServerResponse, body: Json, d: Decision): void {
  const respId = `resp_${randomUUID().replace(/-/g, '')}`;
  const itemId = `item_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
  const callId = `call_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
  let item: Json;
  if (d.answer === 'tool') {
    item = d.tool === 'apply_patch'
      ? { type: 'custom_tool_call', id: itemId, call_id: callId, name: 'apply_patch', input: d.args.input, status: 'completed' }
      : { type: 'function_call', id: itemId, call_id: callId, name: d.tool, arguments: JSON.stringify(d.tool === 'exec_command' ? { cmd: d.args.cmd } : { command: ['bash', '-lc', d.args.cmd] }), status: 'completed' };
  } else {
    item = { type: 'message', id: itemId, role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: d.text, annotations: [] }] };
  }
  const usage = { input_tokens: USAGE.input, input_tokens_details: { cached_tokens: 0 }, output_tokens: USAGE.output, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: USAGE.input + USAGE.output };
  const response = { id: respId, object: 'response', created_at: Math.floor(Date.now() / 1000), status: 'completed', model: body.model, output: [item], usage };
  sse(res, [
    { event: 'response.created', data: { type: 'response.created', sequence_number: 0, response: { ...response, status: 'in_progress', output: [], usage: null } } },
    { event: 'response.output_item.added', data: { type: 'response.output_item.added', sequence_number: 1, output_index: 0, item: { ...item, status: 'in_progress' } } },
    { event: 'response.output_item.done', data: { type: 'response.output_item.done', sequence_number: 2, output_index: 0, item } },
    { event: 'response.completed', data: { type: 'response.completed', sequence_number: 3, response } },
  ]);
}

function chatReply(res: ServerResponse, body: Json, d: Decision): void {
  const id = `chatcmpl-${randomUUID()}`;
  const base = { id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model: body.model };
  const delta = d.answer === 'tool'
    ? { role: 'assistant', tool_calls: [{ index: 0, id: `call_${randomUUID().slice(0, 8)}`, type: 'function', function: { name: d.tool, arguments: JSON.stringify(d.tool === 'bash' ? { command: d.args.command, description: 'write the file' } : { filePath: d.args.filePath, content: d.args.content }) } }] }
    : { role: 'assistant', content: d.text };
  const usage = { prompt_tokens: USAGE.input, completion_tokens: USAGE.output, total_tokens: USAGE.input + USAGE.output };
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ ...base, object: 'chat.completion', choices: [{ index: 0, message: delta, finish_reason: d.answer === 'tool' ? 'tool_calls' : 'stop' }], usage }));
    return;
  }
  sse(res, [
    { data: { ...base, choices: [{ index: 0, delta, finish_reason: null }] } },
    { data: { ...base, choices: [{ index: 0, delta: {}, finish_reason: d.answer === 'tool' ? 'tool_calls' : 'stop' }] } },
    { data: { ...base, choices: [], usage } },
    { data: '[DONE]' },
  ]);
}

export interface FakeModel {
  socketPath: string;
  requests: ServedRequest[];
  /** Requests of each run, in the order the runs first reached the endpoint. */
  runs(): ServedRequest[][];
  close(): Promise<void>;
}

/** Starts the endpoint on `socketPath`; requests must carry `apiKey` (x-api-key or Bearer). */
export async function startFakeModel(socketPath: string, apiKey: string, opts: { log?: (line: string) => void } = {}): Promise<FakeModel> {
  const requests: ServedRequest[] = [];
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://fake');
      const h = (name: string) => String(req.headers[name] ?? '');
      const served: ServedRequest = {
        run: h('x-fake-run'),
        cwd: h('x-fake-cwd'),
        pwd: h('x-fake-pwd'),
        path: url.pathname,
        keyOk: h('x-api-key') === apiKey || h('authorization') === `Bearer ${apiKey}`,
        answer: 'unknown',
        earlierFinals: [],
      };
      requests.push(served);
      let body: Json = {};
      try {
        body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
      } catch {
        /* not JSON */
      }
      served.model = typeof body.model === 'string' ? body.model : undefined;
      served.earlierFinals = [...Buffer.concat(chunks).toString('utf8').matchAll(/Wrote ([\w.-]+)\. <promise>COMPLETE<\/promise>/g)].map((m) => m[1]);
      opts.log?.(`${req.method} ${url.pathname} run=${served.run} model=${served.model} tools=${Array.isArray(body.tools) ? body.tools.length : 0}`);
      if (req.method !== 'POST') {
        if (/\/models$/.test(url.pathname)) {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ object: 'list', data: [], models: [] }));
          return;
        }
        res.writeHead(404).end();
        return;
      }
      if (!served.keyOk) {
        res.writeHead(401, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ type: 'error', error: { type: 'authentication_error', message: 'invalid x-api-key' } }));
        return;
      }
      let d: Decision;
      if (url.pathname.endsWith('/messages') && !url.pathname.includes('count_tokens')) {
        d = decide(anthropicView(body), served.cwd);
        anthropicReply(res, body, d);
      } else if (url.pathname.endsWith('/responses')) {
        d = decide(responsesView(body), served.cwd);
        responsesReply(res, body, d);
      } else if (url.pathname.endsWith('/chat/completions')) {
        d = decide(chatView(body), served.cwd);
        chatReply(res, body, d);
      } else if (url.pathname.endsWith('/count_tokens')) {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ input_tokens: USAGE.input }));
        return;
      } else {
        res.writeHead(404).end();
        return;
      }
      served.answer = d.answer;
      served.usage = { ...USAGE };
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, resolve);
  });
  return {
    socketPath,
    requests,
    runs() {
      const order: string[] = [];
      for (const r of requests) if (!order.includes(r.run)) order.push(r.run);
      return order.map((run) => requests.filter((r) => r.run === run));
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
