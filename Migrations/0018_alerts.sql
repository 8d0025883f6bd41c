-- AdTally schema, part 18: alerts on report metrics (DESIGN §12).
--
-- A rule watches one report metric (any filter) for each of its apps: a threshold
-- ('below', 'above') or a change against a baseline ('change_below', 'change_above':
-- the same hours of the previous 4 same weekdays in the app's zone), over a window of
-- whole hours, with a minimum volume of requests below which it neither fires nor
-- resolves. The elected evaluator (AlertEvaluator) keeps a state per rule and app,
-- records each transition with the numbers that caused it, and delivers it to the
-- rule's webhook: one delivery per transition and webhook, its id kept across retries.
-- A rule spans apps: these are small tables local to the coordinator on Citus, and
-- name the app `app`, not `app_id` (the per-app tables' distribution column).
CREATE TABLE alert_rules (
    name             text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    apps             text[] COLLATE "C" NOT NULL CHECK (cardinality(apps) BETWEEN 1 AND 100),
    metric           text COLLATE "C" NOT NULL,
    -- Report filter parameters, {"network": "admob,unity"}.
    filters          jsonb NOT NULL DEFAULT '{}',
    condition        text COLLATE "C" NOT NULL CHECK (condition IN ('below', 'above', 'change_below', 'change_above')),
    -- The metric's value in the report's units (money in the app's currency), or, for a
    -- change, a fraction (-0.3 for -30 %).
    threshold        double precision NOT NULL CHECK (threshold = threshold AND abs(threshold) < 1e15),
    window_minutes   integer NOT NULL CHECK (window_minutes % 60 = 0 AND window_minutes BETWEEN 60 AND 10080),
    min_requests     bigint NOT NULL DEFAULT 0 CHECK (min_requests >= 0),
    every_seconds    integer NOT NULL DEFAULT 60 CHECK (every_seconds BETWEEN 60 AND 86400),
    -- While firing, notified again this often (0: never).
    renotify_minutes integer NOT NULL DEFAULT 720 CHECK (renotify_minutes BETWEEN 0 AND 43200),
    webhook_url      text NOT NULL CHECK (webhook_url ~ '^https?://[^/?#@]+' AND length(webhook_url) <= 2000),
    -- The webhook's HMAC key, encrypted like network_pulls.credential (Migrations/0017).
    webhook_secret   bytea NOT NULL,
    paused           boolean NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    next_evaluation_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX alert_rules_due ON alert_rules (next_evaluation_at) WHERE NOT paused;

-- Per rule and app: firing or not, and the last evaluation's numbers.
CREATE TABLE alert_states (
    rule             text COLLATE "C" NOT NULL REFERENCES alert_rules (name) ON DELETE CASCADE,
    app              text COLLATE "C" NOT NULL,
    state            text COLLATE "C" NOT NULL DEFAULT 'ok' CHECK (state IN ('ok', 'firing', 'resolved')),
    since            timestamptz NOT NULL DEFAULT now(),
    notified_at      timestamptz,
    evaluated_at     timestamptz,
    value            double precision,
    baseline         double precision,
    requests         bigint,
    window_from      timestamptz,
    window_to        timestamptz,
    -- Why the last evaluation decided nothing (thin volume, no baseline), or null.
    note             text,
    PRIMARY KEY (rule, app)
);

-- Every transition (firing, resolved, a re-notification while firing) and every test
-- notification, with the numbers that caused it.
CREATE TABLE alert_events (
    event_id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    rule             text COLLATE "C" NOT NULL REFERENCES alert_rules (name) ON DELETE CASCADE,
    app              text COLLATE "C",
    kind             text COLLATE "C" NOT NULL CHECK (kind IN ('firing', 'resolved', 'renotify', 'test')),
    at               timestamptz NOT NULL DEFAULT now(),
    value            double precision,
    baseline         double precision,
    requests         bigint,
    window_from      timestamptz,
    window_to        timestamptz,
    evaluator        text
);
CREATE INDEX alert_events_rule ON alert_events (rule, event_id DESC);

-- One delivery per event and webhook: its id (sent as X-AdTally-Delivery and in the
-- body) and body stay the same across retries, so a receiver can drop repeats.
CREATE TABLE alert_deliveries (
    delivery_id      uuid PRIMARY KEY,
    event_id         bigint NOT NULL REFERENCES alert_events (event_id) ON DELETE CASCADE,
    webhook_url      text NOT NULL,
    body             text NOT NULL,
    status           text COLLATE "C" NOT NULL CHECK (status IN ('pending', 'sending', 'retrying', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status      integer,
    error            text,
    delivered_at     timestamptz,
    UNIQUE (event_id, webhook_url)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_at) WHERE status IN ('pending', 'retrying');

-- The evaluator that leads now (adtally status).
CREATE TABLE alert_leader (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    runner text NOT NULL,
    since  timestamptz NOT NULL
);
