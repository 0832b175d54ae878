-- Reserved: number 0013 belongs to issue 30's `0013_idempotency_claims.sql` (branch
-- decision-round3), which lands before the timers of issue 29 (0014). This placeholder
-- only keeps the numbering without a gap on a branch that does not have it yet; delete
-- it when merging with that branch.
SELECT 1;
