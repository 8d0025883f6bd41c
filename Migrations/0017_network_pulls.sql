-- AdTally schema, part 17: the reconciliation as a scheduled export, and pulls of the
-- networks' reports from their APIs (DESIGN §5, §11).

-- 1. A schedule writes a report (the default) or the discrepancy report of
-- GET /v1/reconciliation, with the same parameters.
ALTER TABLE export_schedules
    ADD COLUMN kind text COLLATE "C" NOT NULL DEFAULT 'report' CHECK (kind IN ('report', 'reconciliation'));
