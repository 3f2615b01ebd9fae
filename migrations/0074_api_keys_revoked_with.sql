-- A revoke with ?include_minted=true records, on each key of the tree it
-- revokes, the key it was asked to revoke, so that the same request sent
-- again (its answer lost) answers the same minted_revoked: every key that
-- revoke took with the key, not an empty list (retry QA: a retried revoke
-- of a compromised key answered [] and hid which keys had been minted).
-- Nullable, no default: quick, no rewrite. Keys revoked before it stay
-- NULL (a request sent again for them lists only what it revokes itself).
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS revoked_with_key_id text;
