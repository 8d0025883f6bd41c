-- Every pass, the alert evaluator looks for deliveries left `sending` by a sender that
-- stopped mid-attempt (AlertEvaluator.deliver). alert_deliveries keeps every delivery
-- ever made, so that look reads this index of the few rows in flight, not the table.
CREATE INDEX alert_deliveries_sending ON alert_deliveries (next_attempt_at) WHERE status = 'sending';
