-- AdTally schema, part 27: privacy (issue 44, DESIGN §15): erasure of a device, the
-- tombstones that keep its old events out, and retention per app.
--
-- A device id is personal data. It is stored with every raw event (events.device) and
-- in the device grain of installs (installs, install_days, install_day_revenue, the
-- pending install_delta, Migrations/0023). Erasure removes those rows; what stays holds
-- no identifier: the rollups' counts and money, the HyperLogLog sketches (from
-- Migrations/0028 on, a register keeps the most leading zeros of some hashes, never a
-- hash), the cohort grain (Migrations/0024: sums over devices; the erasure takes the
-- device's rows out of it).
--
--   erasures           the erasure log and its jobs: when, by which key (or the kit's
--                      own request, `kit`), for how many devices, what was removed per
--                      table, and the first and last cohort (install day) the devices
--                      had, so that a cohort report over those days can say an erasure
--                      changed it. Never the ids.
--   erasure_devices    the ids of a job while it is queued or running; deleted in the
--                      transaction that marks the job done.
--   device_tombstones  per app, a keyed hash of each erased id (HMAC-SHA-256 with the
--                      servers' credentials key: without the key, a tombstone cannot be
--                      matched against a guessed id) and the instant of its erasure. The
--                      ingest path answers an event of that device which occurred before
--                      that instant `erased` and does not store it (a kit's queue, a
--                      retried batch); a later event is new data.

CREATE TABLE erasures (
    id             uuid PRIMARY KEY,
    app            text COLLATE "C" NOT NULL,             -- the app (no foreign key: a local table on Citus, apps a reference one)
    requested_at   timestamptz NOT NULL DEFAULT now(),
    requested_by   text NOT NULL,                  -- the admin key's id, or 'kit' (the app's install asked)
    devices        integer NOT NULL CHECK (devices BETWEEN 1 AND 1000),
    status         text NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts       integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    started_at     timestamptz,
    finished_at    timestamptz,
    error          text,
    -- Progress, so that a job resumed after a crash goes on where it was: the raw
    -- events are deleted by ranges of occurred_at, oldest first, up to this instant.
    events_before  timestamptz,
    events_rows    bigint NOT NULL DEFAULT 0,
    installs_rows  bigint NOT NULL DEFAULT 0,
    install_days_rows bigint NOT NULL DEFAULT 0,
    install_day_revenue_rows bigint NOT NULL DEFAULT 0,
    install_delta_rows bigint NOT NULL DEFAULT 0,
    first_cohort   date,
    last_cohort    date
);
CREATE INDEX erasures_open ON erasures (requested_at) WHERE status IN ('queued', 'running');
CREATE INDEX erasures_by_app ON erasures (app, finished_at);

CREATE TABLE erasure_devices (
    erasure_id  uuid NOT NULL REFERENCES erasures (id) ON DELETE CASCADE,
    device      text COLLATE "C" NOT NULL,
    PRIMARY KEY (erasure_id, device)
);

CREATE TABLE device_tombstones (
    app_id       text COLLATE "C" NOT NULL,
    device_hash  bytea NOT NULL,                   -- HMAC-SHA-256(key, app_id || 0x00 || device)
    erased_at    timestamptz NOT NULL,
    PRIMARY KEY (app_id, device_hash)
);

-- One row naming the server that runs erasure jobs (as export_leader).
CREATE TABLE erasure_leader (
    id      boolean PRIMARY KEY DEFAULT true CHECK (id),
    runner  text NOT NULL,
    since   timestamptz NOT NULL
);

-- Days of raw events and device rows kept for this app; NULL: the servers' own
-- (--retention-days). The shorter of the two wins.
ALTER TABLE apps ADD COLUMN retention_days integer CHECK (retention_days BETWEEN 9 AND 36500);
-- The first local day whose device rows (install_days, install_day_revenue) retention
-- kept, set by the maintenance pass before it deletes older ones (NULL: none deleted):
-- cohort reports read from the device rows say so, and re-pricing leaves the cohort
-- grain's money of older days as it is (no device rows are left to price it from).
ALTER TABLE apps ADD COLUMN device_rows_from date;

-- AdTallyKit reports the events it drops when the user forgets the install
-- (`forgetInstall()`) or opts out (`optOut()`), each under a reason of its own.
ALTER TABLE client_drops DROP CONSTRAINT client_drops_reason_check;
ALTER TABLE client_drops ADD CONSTRAINT client_drops_reason_check
    CHECK (reason IN ('queue_full', 'expired', 'damaged', 'forgotten', 'opted_out'));
