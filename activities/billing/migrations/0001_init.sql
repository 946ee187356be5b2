-- Slipway sandbox service billing, version 1.
-- Accounts own tokens, projects, profiles and sandboxes. sandbox_sessions is the append-only
-- billing database: one row per billable interval (compute while ready, snapshot storage while
-- suspended), opened once and closed once.

CREATE TABLE accounts (
  id                 text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,39}$'),
  name               text NOT NULL,
  -- Feature flag: the sandbox surface answers 403 for an account without it.
  sandboxes_enabled  boolean NOT NULL DEFAULT true,
  concurrent_limit   integer NOT NULL DEFAULT 1 CHECK (concurrent_limit >= 0),
  -- Soft cap for dashboards; not enforced.
  monthly_minutes    integer CHECK (monthly_minutes IS NULL OR monthly_minutes >= 0),
  created_at         timestamptz NOT NULL DEFAULT now()
);

-- API tokens are stored as SHA-256 hashes; the token itself is shown once, at creation.
CREATE TABLE api_tokens (
  id            text PRIMARY KEY,
  account_id    text NOT NULL REFERENCES accounts (id),
  name          text NOT NULL,
  token_hash    text NOT NULL UNIQUE,
  prefix        text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  expires_at    timestamptz,
  revoked_at    timestamptz
);

-- Projects exist so grants can be checked: v1 grants reference the account's own projects.
CREATE TABLE projects (
  id          uuid PRIMARY KEY,
  account_id  text NOT NULL REFERENCES accounts (id),
  name        text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name)
);

CREATE TABLE sandbox_profiles (
  id                            text PRIMARY KEY,
  account_id                    text NOT NULL REFERENCES accounts (id),
  name                          text NOT NULL,
  kind                          text NOT NULL DEFAULT 'sandbox',
  provider                      text NOT NULL CHECK (provider IN ('local')),
  platform                      text NOT NULL CHECK (platform IN ('linux', 'macos')),
  resources                     jsonb NOT NULL DEFAULT '{}',
  repository                    text NOT NULL,
  base_ref                      text NOT NULL DEFAULT 'HEAD',
  copy_ignored                  boolean NOT NULL DEFAULT true,
  confinement                   text NOT NULL DEFAULT 'none' CHECK (confinement IN ('none', 'bubblewrap')),
  network                       boolean NOT NULL DEFAULT true,
  idle_timeout_seconds          double precision NOT NULL DEFAULT 300 CHECK (idle_timeout_seconds > 0),
  provisioning_timeout_seconds  double precision NOT NULL DEFAULT 120 CHECK (provisioning_timeout_seconds > 0),
  default_deadline_minutes      double precision NOT NULL DEFAULT 60 CHECK (default_deadline_minutes > 0),
  max_deadline_minutes          double precision NOT NULL DEFAULT 1440 CHECK (max_deadline_minutes > 0),
  absolute_cap_minutes          double precision NOT NULL DEFAULT 10080 CHECK (absolute_cap_minutes > 0),
  warm_replicas                 integer NOT NULL DEFAULT 0 CHECK (warm_replicas >= 0),
  created_at                    timestamptz NOT NULL DEFAULT now(),
  UNIQUE (account_id, name)
);

CREATE TABLE sandboxes (
  id                     text PRIMARY KEY,
  account_id             text NOT NULL REFERENCES accounts (id),
  profile_id             text NOT NULL REFERENCES sandbox_profiles (id),
  project_id             uuid,
  platform               text NOT NULL,
  provider               text NOT NULL,
  status                 text NOT NULL CHECK (status IN
                           ('pending', 'ready', 'suspending', 'suspended', 'restoring', 'terminating', 'terminated', 'failed')),
  provisioning_kind      text CHECK (provisioning_kind IN ('warm_hit', 'cold_boot')),
  -- The provider's handle (local: repository, worktree root and branch). Never a secret.
  repository             text,
  root                   text,
  branch                 text,
  snapshot_ref           text,
  grants                 jsonb NOT NULL DEFAULT '[]',
  created_at             timestamptz NOT NULL,
  ready_at               timestamptz,
  suspended_at           timestamptz,
  terminated_at          timestamptz,
  -- NULL while suspended: the deadline clock is paused; deadline_remaining_ms holds the rest.
  deadline_at            timestamptz,
  deadline_remaining_ms  bigint,
  cap_at                 timestamptz NOT NULL,
  -- Written by every exec/file call (and while one runs); the idle detector reads it.
  last_activity_at       timestamptz NOT NULL,
  end_reason             text,
  error                  text
);
CREATE INDEX sandboxes_account ON sandboxes (account_id, created_at DESC);
-- The concurrency check counts these rows.
CREATE INDEX sandboxes_account_slots ON sandboxes (account_id)
  WHERE status IN ('pending', 'ready', 'suspending', 'suspended', 'restoring');
-- The reaper's scan.
CREATE INDEX sandboxes_reaper ON sandboxes (deadline_at, cap_at)
  WHERE status NOT IN ('terminated', 'failed');

CREATE TABLE sandbox_sessions (
  id                 bigserial PRIMARY KEY,
  account_id         text NOT NULL REFERENCES accounts (id),
  sandbox_id         text NOT NULL REFERENCES sandboxes (id),
  kind               text NOT NULL CHECK (kind IN ('compute', 'snapshot_storage')),
  -- The nth session of this kind for the sandbox, chosen by the workflow: the idempotency key
  -- that makes a retried billing write find its row instead of adding a second one.
  seq                integer NOT NULL CHECK (seq >= 1),
  platform           text NOT NULL,
  provisioning_kind  text,
  started_at         timestamptz NOT NULL,
  ended_at           timestamptz,
  end_reason         text,
  UNIQUE (sandbox_id, kind, seq),
  CHECK (ended_at IS NULL OR ended_at >= started_at),
  CHECK ((ended_at IS NULL) = (end_reason IS NULL))
);
CREATE UNIQUE INDEX sandbox_sessions_one_open ON sandbox_sessions (sandbox_id, kind) WHERE ended_at IS NULL;
CREATE INDEX sandbox_sessions_billing ON sandbox_sessions (account_id, started_at);

-- Append-only: no deletes; an update may only close an open row, once, touching nothing else.
CREATE FUNCTION sandbox_sessions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    RAISE EXCEPTION 'sandbox_sessions is append-only: rows are never deleted';
  END IF;
  IF OLD.ended_at IS NOT NULL THEN
    RAISE EXCEPTION 'sandbox_sessions row % is already closed', OLD.id;
  END IF;
  IF (NEW.id, NEW.account_id, NEW.sandbox_id, NEW.kind, NEW.seq, NEW.platform, NEW.provisioning_kind, NEW.started_at)
     IS DISTINCT FROM
     (OLD.id, OLD.account_id, OLD.sandbox_id, OLD.kind, OLD.seq, OLD.platform, OLD.provisioning_kind, OLD.started_at) THEN
    RAISE EXCEPTION 'sandbox_sessions is append-only: only ended_at and end_reason may be set';
  END IF;
  RETURN NEW;
END;
$$;
CREATE TRIGGER sandbox_sessions_append_only BEFORE UPDATE OR DELETE ON sandbox_sessions
  FOR EACH ROW EXECUTE FUNCTION sandbox_sessions_append_only();

-- One short-lived token per grant; only the hash is stored. Re-minting (a retried
-- provisioning activity) replaces the row for the same (sandbox, idx).
CREATE TABLE grant_tokens (
  id          text PRIMARY KEY,
  sandbox_id  text NOT NULL REFERENCES sandboxes (id),
  account_id  text NOT NULL REFERENCES accounts (id),
  idx         integer NOT NULL,
  project_id  uuid NOT NULL REFERENCES projects (id),
  scopes      text[] NOT NULL,
  token_hash  text NOT NULL UNIQUE,
  expires_at  timestamptz NOT NULL,
  revoked_at  timestamptz,
  created_at  timestamptz NOT NULL DEFAULT now(),
  UNIQUE (sandbox_id, idx)
);

-- Who did what to whose sandbox: grants received, deletes, abnormal exits.
CREATE TABLE audit_events (
  id          bigserial PRIMARY KEY,
  account_id  text NOT NULL,
  sandbox_id  text,
  event       text NOT NULL,
  detail      jsonb NOT NULL DEFAULT '{}',
  at          timestamptz NOT NULL DEFAULT now()
);

-- Pre-provisioned sandboxes per profile. A create claims one atomically; the claim names the
-- sandbox, so a retried claim finds its own row.
CREATE TABLE warm_sandboxes (
  id          text PRIMARY KEY,
  profile_id  text NOT NULL REFERENCES sandbox_profiles (id),
  repository  text NOT NULL,
  root        text NOT NULL,
  branch      text NOT NULL,
  created_at  timestamptz NOT NULL DEFAULT now(),
  claimed_by  text UNIQUE,
  claimed_at  timestamptz
);
CREATE INDEX warm_sandboxes_free ON warm_sandboxes (profile_id, created_at) WHERE claimed_by IS NULL;
