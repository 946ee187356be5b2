-- Preview ports (ADR 0015): the ports of a sandbox exposed at a preview origin. A closed port
-- keeps its row (closed_at) for the audit trail; opening it again makes a new row.
CREATE TABLE preview_ports (
  id          bigserial   PRIMARY KEY,
  sandbox_id  text        NOT NULL REFERENCES sandboxes (id),
  account_id  text        NOT NULL REFERENCES accounts (id),
  port        integer     NOT NULL CHECK (port BETWEEN 1 AND 65535),
  opened_at   timestamptz NOT NULL DEFAULT now(),
  closed_at   timestamptz
);
CREATE UNIQUE INDEX preview_ports_open ON preview_ports (sandbox_id, port) WHERE closed_at IS NULL;
