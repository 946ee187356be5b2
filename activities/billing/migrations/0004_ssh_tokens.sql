-- SSH through the broker (ADR 0015): short-lived credentials bound to one sandbox, stored as
-- SHA-256 hashes (256 random bits each), revocable.
CREATE TABLE ssh_tokens (
  id          text        PRIMARY KEY,
  account_id  text        NOT NULL REFERENCES accounts (id),
  sandbox_id  text        NOT NULL REFERENCES sandboxes (id),
  token_hash  text        NOT NULL UNIQUE,
  created_by  text        NOT NULL,   -- the API token that minted it
  created_at  timestamptz NOT NULL DEFAULT now(),
  expires_at  timestamptz NOT NULL,
  revoked_at  timestamptz
);
CREATE INDEX ssh_tokens_sandbox ON ssh_tokens (sandbox_id);
