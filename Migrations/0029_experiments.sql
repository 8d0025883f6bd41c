-- AdTally schema, part 29: experiments on the switch (DESIGN §14).
--
-- An experiment tests a mediation change on a share of devices: each device of the
-- app that asks the switch for the experiment's placement (with its per-install id,
-- `device`) is assigned an arm once and for good — a hash of the experiment's salt
-- and the device — and answered that arm's network. One experiment runs per app ×
-- placement (the partial unique index); a stopped one stays, with who decided what
-- on which result.
CREATE TABLE experiments (
    app_id          text COLLATE "C" NOT NULL REFERENCES apps (app_id) ON DELETE CASCADE,
    name            text COLLATE "C" NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_.-]{0,63}$'),
    -- The assignment's salt: a new experiment (even under an old name's twin in another
    -- app) splits devices afresh.
    salt            uuid NOT NULL,
    placement       text COLLATE "C" NOT NULL CHECK (placement <> ''),
    -- ISO 3166-1 alpha-2 codes; empty: every country.
    countries       text[] NOT NULL DEFAULT '{}',
    -- The arms' policies as `adtally mediation set` takes them (MediationPolicy's JSON).
    control         jsonb NOT NULL,
    treatment       jsonb NOT NULL,
    treatment_share integer NOT NULL CHECK (treatment_share IN (10, 20, 50)),
    status          text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'stopped')),
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by      text NOT NULL,
    stopped_at      timestamptz,
    kept            text CHECK (kept IN ('control', 'treatment')),
    stopped_by      text,
    -- The results when it was stopped (the verdict and the ARPDAU lift), as shown then.
    decision        jsonb,
    PRIMARY KEY (app_id, name),
    CHECK ((status = 'running') = (stopped_at IS NULL))
);
CREATE UNIQUE INDEX experiments_running ON experiments (app_id, placement) WHERE status = 'running';

-- Each device's first exposure: the first switch answer it got under the experiment.
-- Written once per device (servers remember whom they recorded, and batch the rest),
-- never per request. A device id is personal data: erasure (DESIGN §15) deletes these.
CREATE TABLE experiment_exposures (
    app_id     text COLLATE "C" NOT NULL,
    experiment text COLLATE "C" NOT NULL,
    device     text COLLATE "C" NOT NULL,
    arm        text NOT NULL CHECK (arm IN ('control', 'treatment')),
    first_at   timestamptz NOT NULL,
    PRIMARY KEY (app_id, experiment, device),
    -- To the app, not the experiment: Citus refuses a foreign key between two tables while
    -- the first is distributed and the other not yet (deploy/citus-setup.sql places them
    -- one by one); experiments are never deleted but with their app.
    FOREIGN KEY (app_id) REFERENCES apps (app_id) ON DELETE CASCADE
);
-- Access and erasure find a device's rows by app and device.
CREATE INDEX experiment_exposures_device ON experiment_exposures (app_id, device);

-- The arms' policies live beside the placement's own (arm '' is the placement's policy),
-- so that an automatic arm is decided, with its own incumbent and hysteresis, by the same
-- refresher; their history says which arm.
ALTER TABLE mediation_policies ADD COLUMN arm text COLLATE "C" NOT NULL DEFAULT '' CHECK (arm IN ('', 'control', 'treatment'));
ALTER TABLE mediation_policies DROP CONSTRAINT mediation_policies_pkey;
ALTER TABLE mediation_policies ADD PRIMARY KEY (app_id, placement, country, arm);
ALTER TABLE mediation_changes ADD COLUMN arm text COLLATE "C" NOT NULL DEFAULT '';

-- An erasure (Migrations/0027) removes a device's exposures with its install rows, and counts them.
ALTER TABLE erasures ADD COLUMN experiment_exposures_rows bigint NOT NULL DEFAULT 0;
