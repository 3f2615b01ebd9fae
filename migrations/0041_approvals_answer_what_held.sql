-- An approval answers every reason an operator's yes was needed for when it
-- was given (lib/gate sqlDecideApproval): the type's require_approval mode,
-- a breaker or the emergency stop holding the type with require_approval,
-- an amount at or above approval_above_micros. A key held for two of them
-- at once was asked once for each, the second question only after the
-- first yes, where API.md §2.4 has the next begin after an approval execute.
-- NULL (an approval decided before this, or rejected): the reason it was
-- asked for alone.
ALTER TABLE approvals ADD COLUMN IF NOT EXISTS answers text[];
