-- AdTally schema, part 6: scheduled exports (DESIGN §5).
--
-- A schedule is a saved report query, a format, a 5-field cron expression in an
-- IANA zone and a destination directory. One server at a time runs schedules:
-- the one holding the export runner's advisory lock (ExportRunner.swift), on the
-- connection it claims and finishes runs with.
--
-- A run row is the claim and the proof of a slot: its primary key (schedule,
-- slot, pass) makes a slot's file exist at most once per pass, whichever server
-- plans it and however often. Pass 1 is the slot's file; pass 2 the file written
-- again once the days of a provisional pass 1 are final.
CREATE TABLE export_schedules (
    name            text COLLATE "C" PRIMARY KEY CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    -- The report parameters, as GET /v1/reports takes them (name → value).
    query           jsonb NOT NULL,
    format          text NOT NULL CHECK (format IN ('csv', 'json')),
    cron            text NOT NULL,
    timezone        text NOT NULL,
    directory       text NOT NULL,
    paused          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- Every slot due up to this instant is planned (a run row) or counted skipped.
    planned_through timestamptz NOT NULL DEFAULT now(),
    -- Slots missed by more than the catch-up limit, and the last of them.
    skipped_slots   bigint NOT NULL DEFAULT 0,
    last_skipped    text
);

CREATE TABLE export_runs (
    schedule      text COLLATE "C" NOT NULL REFERENCES export_schedules (name) ON DELETE CASCADE,
    -- The slot in the schedule's zone, YYYYMMDDTHHMM (the file's name).
    slot          text COLLATE "C" NOT NULL,
    pass          smallint NOT NULL CHECK (pass IN (1, 2)),
    due_at        timestamptz NOT NULL,
    -- pending → running → succeeded; a failure → retrying (after next_attempt_at),
    -- and failed once the attempts run out.
    status        text NOT NULL CHECK (status IN ('pending', 'running', 'retrying', 'succeeded', 'failed')),
    trigger       text NOT NULL DEFAULT 'schedule' CHECK (trigger IN ('schedule', 'manual', 'final')),
    attempts      integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    runner        text,
    started_at    timestamptz,
    finished_at   timestamptz,
    duration_ms   bigint,
    rows          bigint,
    bytes         bigint,
    sha256        text,
    file          text,
    -- provisional or final (the manifest's status), once written.
    file_status   text CHECK (file_status IN ('provisional', 'final')),
    -- For a provisional file: when its last day is final and pass 2 is due.
    final_due_at  timestamptz,
    error         text,
    PRIMARY KEY (schedule, slot, pass)
);

-- Who took the runner lock last, and when (adtally status; the lock itself, in
-- pg_locks, says whether it is still held).
CREATE TABLE export_leader (
    id     boolean PRIMARY KEY DEFAULT true CHECK (id),
    runner text NOT NULL,
    since  timestamptz NOT NULL
);

-- The runner's next work: runnable rows in due order.
CREATE INDEX export_runs_runnable ON export_runs (next_attempt_at) WHERE status IN ('pending', 'retrying');
-- Provisional files waiting for their final pass.
CREATE INDEX export_runs_final_due ON export_runs (final_due_at) WHERE final_due_at IS NOT NULL AND pass = 1;
-- History, newest first.
CREATE INDEX export_runs_history ON export_runs (schedule, due_at DESC);

-- adtally status: events received in the last minute and hour. Events arrive
-- roughly in received order, so a BRIN index finds the recent ones in each
-- partition for a few pages of index.
CREATE INDEX events_received_at ON events USING brin (received_at);

-- adtally status: how long the oldest pending delta has waited for compaction.
ALTER TABLE rollup_delta ADD COLUMN added_at timestamptz NOT NULL DEFAULT now();
