-- Idempotency keys of POST create and exec: a retried request with the same key gets the first
-- answer (create: the same sandbox; exec: the same result) instead of doing the work twice.
CREATE TABLE idempotency_keys (
  account_id    text        NOT NULL,
  scope         text        NOT NULL,   -- 'create', or 'exec:<sandbox id>'
  key           text        NOT NULL,
  request_hash  text        NOT NULL,   -- sha256 of the request body: the same key with another body is refused
  sandbox_id    text,
  response      jsonb,                  -- exec: the stored answer once it finished
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (account_id, scope, key)
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

-- The service never runs a tenant unconfined by default (ADR 0006): the column defaults follow.
ALTER TABLE sandbox_profiles ALTER COLUMN confinement SET DEFAULT 'bubblewrap';
ALTER TABLE sandbox_profiles ALTER COLUMN network SET DEFAULT false;
