-- The worker that holds a service sandbox (ADR 0013): its id, `any` for a provider any host can
-- reach, NULL for sandboxes made before owners were recorded (served directly, as before).
ALTER TABLE sandboxes ADD COLUMN owner text;
