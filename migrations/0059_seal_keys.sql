-- The ids of the encryption keys stored values may be sealed with, so that
-- a key missing from an instance's RESULT_ENCRYPTION_KEY /
-- RESULT_ENCRYPTION_KEYS (removed before a reseal reported complete) is
-- noticed without reading every sealed column: until now it went unnoticed
-- until a read of such a value failed, the instance starting and answering
-- everything else as if all were well (seal QA).
--
-- The sweeper records its current key here every pass, and its task
-- seal.keys fails, naming them, while an id recorded here is not one of its
-- keys (lib/reseal.MissingKeys). The reseal command records every key id
-- it counts, and once nothing is sealed with a key other than the current
-- one, forgets the others. A tiny table: one row per key ever current
-- since, minus those a complete reseal forgot.
--
-- The previous release neither reads nor writes it.

CREATE TABLE seal_keys (
    key_id text PRIMARY KEY CHECK (key_id ~ '^[0-9a-f]{8}$'),
    recorded_at timestamptz NOT NULL DEFAULT now()
);
