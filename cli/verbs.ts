/**
 * What `slipway --help` says of the command groups registered by cli/commands/* modules. Kept
 * apart from those modules so the top-level help lists them without loading them (and what they
 * import: the Temporal client, the billing database, the sandbox providers).
 */
export const GROUP_DESCRIPTIONS = {
  sandbox: 'use sandboxes through the API (SLIPWAY_API_URL, SLIPWAY_API_TOKEN)',
  api: 'serve the sandbox API (REST, MCP, metrics) with its worker, watcher and reaper',
  mcp: 'MCP server over stdio for agents (uses SLIPWAY_API_URL and SLIPWAY_API_TOKEN)',
  account: 'sandbox service accounts (billing database)',
  token: 'account API tokens (stored hashed; shown once)',
  project: 'projects (grants name them)',
  profile: 'sandbox profiles: name -> provider, platform, resources, lifecycle thresholds',
  usage: 'billable minutes from the sandbox_sessions table (one SQL query)',
  budget: "an objective's spending limits (`budget:` in the objective file)",
  schedules: "Slipway's Temporal Schedules (the janitor)",
  template: 'the prepared template (ignored files copied, project setup done) new sandboxes and the warm pool start from',
  worktree: "review, merge or discard one stream's work (in the repository of the current directory)",
  trust: "allow a repository's own .slipway/config.yaml, its prompt files and .slipway/blueprints/ (as they are now) to be used; any change needs trust again",
  'codec-server': 'decode encrypted history payloads (SLIPWAY_PAYLOAD_KEY) for the Temporal Web UI and CLI',
} as const;
