import type { AgentProviderKind } from '../../core/objective-schema';
import type { AgentProvider } from './provider';
import { scriptProvider } from './script';

const providers: Partial<Record<AgentProviderKind, AgentProvider>> = {
  script: scriptProvider,
};

export function agentProvider(kind: AgentProviderKind): AgentProvider {
  const provider = providers[kind];
  if (!provider) throw new Error(`agent provider "${kind}" is not available yet`);
  return provider;
}
