-- The idempotency record in PostgreSQL: its table, and its claim decided in
-- one function, as idempotency.lua decides it on Redis; every language's
-- store runs this DDL and calls the function (docs/idempotency.md,
-- "PostgreSQL: the record in the business transaction"). Each store writes
-- its table's quoted name, its index's and its function's for the
-- placeholders in braces, and the table's name as a string for {name}. Run
-- again after an upgrade: it leaves the table and its rows as they are.
CREATE TABLE IF NOT EXISTS {table} (
  scope       text        NOT NULL,
  key         text        NOT NULL,
  state       text        NOT NULL CHECK (state IN ('in_progress', 'completed')),
  token       text,
  lease_until timestamptz,
  request     text        NOT NULL,
  status      integer,
  headers     jsonb,
  body        bytea,
  too_large   boolean     NOT NULL DEFAULT false,
  truncated   boolean     NOT NULL DEFAULT false,
  expires_at  timestamptz NOT NULL,
  PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);
-- Claims key (within scope) for a request whose fingerprint is
-- request, with the caller's token: started (the row written in_progress,
-- its lease lease_ms, kept retention_ms; taken_over when the previous
-- owner's lease had run out), in_progress (retry_after_s: 1 while another
-- transaction holds the key, else the seconds left of the lease), conflict
-- (another fingerprint) or completed (the stored response). A key another
-- transaction holds (a claim, or a transactional once until its caller's
-- transaction ends) is answered at once, never waited on: its advisory lock
-- is tried, and lasts until this transaction ends.
CREATE OR REPLACE FUNCTION {function}(p_scope text, p_key text, p_request text,
  p_token text, lease_ms bigint, retention_ms bigint, OUT state text, OUT retry_after_s bigint,
  OUT taken_over boolean, OUT status integer, OUT headers text, OUT body bytea, OUT too_large boolean,
  OUT truncated boolean)
LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  retry_after_s := 0;
  taken_over := false;
  too_large := false;
  truncated := false;
  IF NOT pg_try_advisory_xact_lock(hashtextextended({name} || E'\n' || p_scope || E'\n' || p_key, 0)) THEN
    state := 'in_progress';
    retry_after_s := 1;
    RETURN;
  END IF;
  SELECT t.state, t.request, t.status, t.headers::text AS headers, t.body, t.too_large, t.truncated,
      (extract(epoch FROM t.lease_until - clock_timestamp()) * 1000)::bigint AS lease_left_ms,
      t.expires_at <= clock_timestamp() AS expired
    INTO r FROM {table} t WHERE t.scope = p_scope AND t.key = p_key FOR UPDATE;
  IF FOUND AND NOT r.expired THEN -- a row past its retention counts as absent
    IF r.request <> p_request THEN
      state := 'conflict';
      RETURN;
    ELSIF r.state = 'completed' THEN
      state := 'completed';
      status := r.status;
      headers := r.headers;
      body := r.body;
      too_large := r.too_large;
      truncated := r.truncated;
      RETURN;
    ELSIF r.state <> 'in_progress' THEN
      RAISE EXCEPTION 'idempotency: % holds state %, not in_progress or completed', {name}, r.state;
    ELSIF r.lease_left_ms > 0 THEN
      state := 'in_progress';
      retry_after_s := (r.lease_left_ms + 999) / 1000;
      RETURN;
    END IF;
    taken_over := true; -- its owner's lease ran out
  END IF;
  INSERT INTO {table} AS t (scope, key, state, token, lease_until, request, status, headers, body, too_large,
      truncated, expires_at)
    VALUES (p_scope, p_key, 'in_progress', p_token, clock_timestamp() + lease_ms * interval '1 millisecond', p_request,
      NULL, NULL, NULL, false, false, clock_timestamp() + retention_ms * interval '1 millisecond')
    ON CONFLICT (scope, key) DO UPDATE SET state = excluded.state, token = excluded.token,
      lease_until = excluded.lease_until, request = excluded.request, status = NULL, headers = NULL, body = NULL,
      too_large = false, truncated = false, expires_at = excluded.expires_at;
  state := 'started';
END
$$;
