/**
 * Agent providers by kind. `agentProvider(kind)` returns a provider for ONE agent run: the real
 * agents' parsers keep per-run state (session id already reported, cumulative usage baselines,
 * the text of the current step), so an instance must never be shared between runs.
 * Adding a provider: see docs/adding-an-agent-provider.md.
 */
import type { AgentProviderKind } from '../core/objective-schema';
import { createClaudeCodeProvider } from './claude-code';
import { createCodexProvider } from './codex';
import { createCopilotProvider } from './copilot';
import { createOpencodeProvider } from './opencode';
import { createPiProvider } from './pi';
import type { AgentProvider, ProviderOptions } from './provider';
import { scriptProvider } from './script';

const factories: Record<AgentProviderKind, (options: ProviderOptions) => AgentProvider> = {
  script: () => scriptProvider, // stateless
  'claude-code': createClaudeCodeProvider,
  codex: createCodexProvider,
  opencode: createOpencodeProvider,
  pi: createPiProvider,
  copilot: createCopilotProvider,
};

export function agentProvider(kind: AgentProviderKind, options: ProviderOptions = {}): AgentProvider {
  const factory = Object.hasOwn(factories, kind) ? factories[kind] : undefined;
  if (!factory) throw new Error(`unknown agent provider "${kind}"`);
  return factory(options);
}
