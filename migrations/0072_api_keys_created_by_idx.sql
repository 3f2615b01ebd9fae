-- GET /api/v1/keys?created_by= pages the keys one key minted, oldest
-- first: with no index led by the workspace and the minting key, its plan
-- read the workspace's keys in id order through api_keys_workspace_idx and
-- kept the minted ones (the keys a key minted long ago, among a
-- workspace's thousands, read all of those after them for each page; a key
-- that minted none read every key of its workspace). The id ends the index
-- so that a page after a cursor starts at the cursor and needs no sort.
-- Keys are written once each (their revoke changes no indexed column). On
-- a large table build it first, concurrently (README, Upgrading).
CREATE INDEX IF NOT EXISTS api_keys_created_by_idx ON api_keys (workspace_id, created_by_key_id, id);
