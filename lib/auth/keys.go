package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/getratchet/ratchet/lib/apierr"
	"github.com/getratchet/ratchet/lib/db"
	"github.com/getratchet/ratchet/lib/idempotency"
	"github.com/getratchet/ratchet/lib/ids"
	"github.com/getratchet/ratchet/lib/jsonx"
	"github.com/getratchet/ratchet/lib/keyedhash"
	"github.com/getratchet/ratchet/lib/money"
	"github.com/getratchet/ratchet/lib/toolname"
)

// A secret reads rk_<key id body>_<64 hex chars>. Embedding the id makes
// authentication a primary-key lookup followed by a constant-time comparison,
// rather than an index probe keyed by the secret itself.
const secretPrefix = "rk_"

// Key is an API key as the API shows it (never with its hash).
type Key struct {
	ID                      string   `json:"id"`
	Name                    string   `json:"name"`
	Scopes                  []string `json:"scopes" openapi:"itemEnum=effects:begin|effects:report|effects:read|effects:resolve|policies:read|policies:write|approvals:write|keys:write|runs:write|runs:read|jobs:work|steps:replay|endpoints:write|contracts:write|webhooks:write|reconcile:write|billing:write,notNull"` // never empty
	Tools                   []string `json:"tools" jsonschema:"the exact name@version pairs this key is restricted to: with jobs:work it registers only these, and it mints and revokes keys with jobs:work only within them (other keys as its scopes allow); null when it is not restricted to tools (any tool, as a root key)"`
	DailySpendCeilingMicros *int64   `json:"daily_spend_ceiling_micros"`
	RateLimitPerMinute      *int     `json:"rate_limit_per_minute"`
	// CreatedByKeyID is read-only: set when the key is minted, never
	// changed. Revoking a key leaves the keys it minted live; this is how
	// they are found (GET /api/v1/keys?created_by=, security review), and
	// revoked with it (RevokeKeyTree).
	CreatedByKeyID *string    `json:"created_by_key_id" jsonschema:"the key that minted this one (POST /api/v1/keys); null for a workspace's signup key. Revoking a key does not revoke the keys it minted (list them with GET /api/v1/keys?created_by=), unless revoked with DELETE /api/v1/keys/{id}?include_minted=true, which revokes every live key minted from it"`
	CreatedAt      time.Time  `json:"created_at"`
	RevokedAt      *time.Time `json:"revoked_at"`
}

// NewKey is what creating a key returns: the key with its secret, shown once.
type NewKey struct {
	Key
	Secret string `json:"secret"`
}

// SecretOf names the key whose secret k shows: the answer kept for its
// create's Idempotency-Key is linked to it (idempotency.Answer's
// Resource), and its revoke erases that answer (RevokeKey).
func (k NewKey) SecretOf() string { return k.ID }

// SecretKind is a key's: the answers kept before migration 0068 that show
// its secret (a create's NewKey), which name no key, are linked to it by
// the sweeper (idempotency.SecretShownBy). A key's id prefix is not a
// webhook's.
var SecretKind = idempotency.SecretKind{IDPrefix: ids.Key, SecretPrefix: secretPrefix}

// Service authenticates and manages keys.
type Service struct {
	pool       *pgxpool.Pool
	hashSecret *keyedhash.Key
	limiter    *Limiter
	now        func() time.Time

	cacheTTL time.Duration
	mu       sync.Mutex
	cache    map[string]cachedKey // by key id
	// forgets counts the revocations this instance made: a lookup that
	// read a key before one committed must not cache what it read, which
	// may be the revoked key (security review), so it caches only when
	// none happened meanwhile.
	forgets uint64
}

type cachedKey struct {
	hash      []byte
	principal *Principal
	expires   time.Time
}

// maxCachedKeys bounds the cache; beyond it entries are dropped wholesale,
// which costs at most one extra lookup per key.
const maxCachedKeys = 10_000

// NewService returns a key service. cacheTTL bounds how long a key revoked on
// another instance may still be accepted here (zero disables caching).
func NewService(pool *pgxpool.Pool, hashSecret string, cacheTTL time.Duration, now func() time.Time) *Service {
	return &Service{
		pool: pool, hashSecret: keyedhash.New([]byte(hashSecret)), limiter: NewLimiter(pool, now), now: now,
		cacheTTL: cacheTTL, cache: map[string]cachedKey{},
	}
}

// Limiter exposes the shared rate limiter.
func (s *Service) Limiter() *Limiter { return s.limiter }

// Hash is HMAC-SHA-256 with KEY_HASH_SECRET; also used for values that must be
// matched but never stored in clear (dimension values).
func (s *Service) Hash(v string) []byte {
	return s.hashSecret.SumString(v)
}

func errBadKey() error {
	return apierr.Unauthorized("Missing, malformed, or revoked key.")
}

// ErrRevokedKey is the answer to a request whose key was authenticated from
// an instance's cache but is found revoked by the statement that would act
// for it: the same as for any key that does not authenticate.
func ErrRevokedKey() error { return errBadKey() }

// LiveKeySQL is a condition that holds while the key whose id is the SQL
// expression id is not revoked. A statement that acts for a key carries
// it, so that a key revoked on one instance acts no more on another whose
// cache still holds it (KEY_CACHE_TTL).
func LiveKeySQL(id string) string {
	return `EXISTS (SELECT 1 FROM api_keys k WHERE k.id = ` + id + ` AND k.revoked_at IS NULL)`
}

// sqlKeyRevoked says whether key $1 is revoked (or unknown).
var sqlKeyRevoked = `SELECT NOT ` + LiveKeySQL("$1::text")

// KeyRevoked says whether keyID is revoked (or unknown): for a statement
// that checked the key and acted on nothing, to tell a revoked key from
// nothing to act on.
func KeyRevoked(ctx context.Context, q db.Querier, keyID string) (bool, error) {
	var revoked bool
	if err := q.QueryRow(ctx, sqlKeyRevoked, keyID).Scan(&revoked); err != nil {
		return false, fmt.Errorf("check key: %w", err)
	}
	return revoked, nil
}

// sqlLiveKey key-share-locks key $1's row while it is not revoked: a
// revocation, which locks the row FOR UPDATE before it writes
// (sqlLockRevoke), waits for the transaction that took it, and one that
// committed first leaves no live row to lock.
const sqlLiveKey = `SELECT true FROM api_keys WHERE id = $1::text AND revoked_at IS NULL FOR KEY SHARE`

// RequireLive checks, inside tx, that keyID is not revoked, and holds its
// row until tx ends, so the key cannot be revoked before tx commits: a key
// revoked on another instance, whose cache still holds it for
// KEY_CACHE_TTL, or as the request ran, acts no more (ErrRevokedKey). A
// replay and a mint take it themselves; lib/httpapi has every other
// transaction of a call that changes something take it last, before it
// commits (db.WithCheck), settling calls aside; begin, enqueue and claim
// check the key in their own statements instead, without a lock.
func RequireLive(ctx context.Context, tx pgx.Tx, keyID string) error {
	var live bool
	err := tx.QueryRow(ctx, sqlLiveKey, keyID).Scan(&live)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrRevokedKey()
	}
	if err != nil {
		return fmt.Errorf("check key: %w", err)
	}
	return nil
}

// parseSecret splits rk_<id body>_<hex>.
func parseSecret(secret string) (keyID string, ok bool) {
	var buf [keyIDLen]byte
	id, ok := appendKeyID(buf[:0], secret)
	return string(id), ok
}

// keyIDLen is a key id's length, ids.Len(ids.Key) (TestParseSecret).
const keyIDLen = len(ids.Key) + 27

// appendKeyID appends to buf the id of the key whose secret is
// rk_<id body>_<hex>, when secret is one: authenticate makes a string of
// it only for a key it reads from the database (pprof: the id's string,
// made for every request, was one of authorize's allocations).
func appendKeyID(buf []byte, secret string) ([]byte, bool) {
	rest, ok := strings.CutPrefix(secret, secretPrefix)
	if !ok {
		return buf, false
	}
	body, random, ok := strings.Cut(rest, "_")
	if !ok || len(random) != 64 {
		return buf, false
	}
	buf = append(append(append(buf, ids.Key...), '_'), body...)
	return buf, ids.Valid(ids.Key, string(buf))
}

const authSQL = `
WITH k AS (
    SELECT id, workspace_id, secret_hash, scopes, tools, daily_spend_ceiling_micros,
           rate_limit_per_minute, revoked_at
    FROM api_keys WHERE id = $1
), inc AS (
    INSERT INTO rate_counters (bucket, window_start, shard, count)
    SELECT 'key:' || k.id, $3, 0, 1 FROM k
    WHERE $4::bool AND k.rate_limit_per_minute IS NOT NULL AND k.revoked_at IS NULL AND k.secret_hash = $2
    ON CONFLICT (bucket, window_start, shard) DO UPDATE SET count = rate_counters.count + 1
    RETURNING count
)
SELECT k.workspace_id, k.secret_hash, k.scopes, k.tools, k.daily_spend_ceiling_micros,
       k.rate_limit_per_minute, k.revoked_at IS NOT NULL, coalesce((SELECT count FROM inc), 0)::bigint
FROM k`

// Authenticate resolves a bearer secret to its principal and counts the
// request against the key's rate limit. A cached key costs no round trip
// unless it is rate limited; an uncached key costs exactly one, which both
// looks it up and counts it.
func (s *Service) Authenticate(ctx context.Context, secret string) (*Principal, error) {
	return s.authenticate(ctx, secret, true, true)
}

// AuthenticateUncached is Authenticate read from the database whatever the
// cache holds: for a call that changes something and whose own statements
// do not check the key (a policy, a webhook, a run...), whose transactions
// hold the key live as they write (RequireLive), so that a key revoked on
// another instance is refused before the call does anything. It costs the
// one round trip a rate-limited cached key costs anyway, and caches what
// it reads.
func (s *Service) AuthenticateUncached(ctx context.Context, secret string) (*Principal, error) {
	return s.authenticate(ctx, secret, true, false)
}

// Verify resolves a bearer secret like Authenticate without counting the
// request against the key's rate limit: for a protocol endpoint (MCP) whose
// every tool call is a request of its own, counted when it runs.
func (s *Service) Verify(ctx context.Context, secret string) (*Principal, error) {
	return s.authenticate(ctx, secret, false, true)
}

// Settling calls (a report, a heartbeat: they settle what a counted call
// began) are counted in a bucket of their own, settleAllowance times the
// key's limit and at least minSettlePerMinute: the calls that begin work
// never use up what the reports that settle them need (a refused report
// turns an outcome its holder knows into an unknown one, and a refused job
// heartbeat lapses a lease), while a flood of them is still bounded. The
// bucket is sized for agents; a worker key's heartbeats grow with its
// running jobs (README: leave worker keys unlimited).
const (
	settleAllowance    = 10
	minSettlePerMinute = 600
)

// AuthenticateSettling is Authenticate for a settling call: counted in the
// key's settling bucket instead of its limit.
func (s *Service) AuthenticateSettling(ctx context.Context, secret string) (*Principal, error) {
	p, err := s.authenticate(ctx, secret, false, true)
	if err != nil || p.RateLimitPerMinute == nil {
		return p, err
	}
	limit := max(settleAllowance**p.RateLimitPerMinute, minSettlePerMinute)
	ok, retry, err := s.limiter.Allow(ctx, "settle:"+p.KeyID, limit, time.Minute)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, apierr.RateLimited(retry)
	}
	return p, nil
}

// authenticate resolves secret, counting the request against the key's
// limit when count is set, and answering from the cache when useCache is set
// and the cache holds the key.
func (s *Service) authenticate(ctx context.Context, secret string, count, useCache bool) (*Principal, error) {
	var buf [keyIDLen]byte
	id, ok := appendKeyID(buf[:0], secret)
	if !ok {
		return nil, errBadKey()
	}
	hash := s.Hash(secret)
	now := s.now().UTC()
	window := now.Truncate(time.Minute)

	var hit *Principal
	if useCache {
		hit = s.cached(id, hash, now)
	}
	if hit != nil {
		if hit.RateLimitPerMinute == nil || !count {
			return hit, nil
		}
		ok, retry, err := s.limiter.Allow(ctx, "key:"+hit.KeyID, *hit.RateLimitPerMinute, time.Minute)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, apierr.RateLimited(retry)
		}
		return hit, nil
	}

	keyID := string(id)
	s.mu.Lock()
	epoch := s.forgets
	s.mu.Unlock()
	var (
		p       = &Principal{KeyID: keyID}
		stored  []byte
		rate    *int32
		revoked bool
		used    int64 // this window's requests, this one included
	)
	err := s.pool.QueryRow(ctx, authSQL, keyID, hash, window, count).Scan(
		&p.WorkspaceID, &stored, &p.Scopes, &p.Tools, &p.DailySpendCeilingMicros, &rate, &revoked, &used)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errBadKey()
	}
	if err != nil {
		return nil, fmt.Errorf("authenticate key: %w", err)
	}
	if subtle.ConstantTimeCompare(stored, hash) != 1 || revoked {
		return nil, errBadKey()
	}
	if rate != nil {
		r := int(*rate)
		p.RateLimitPerMinute = &r
	}
	s.store(keyID, hash, p, now, epoch)
	if count && p.RateLimitPerMinute != nil && used > int64(*p.RateLimitPerMinute) {
		return nil, apierr.RateLimited(retryAfterSeconds(now, window.Add(time.Minute)))
	}
	return p, nil
}

func (s *Service) cached(keyID []byte, hash []byte, now time.Time) *Principal {
	if s.cacheTTL <= 0 {
		return nil
	}
	s.mu.Lock()
	c, ok := s.cache[string(keyID)] // no string made for the look-up
	s.mu.Unlock()
	if !ok || now.After(c.expires) || subtle.ConstantTimeCompare(c.hash, hash) != 1 {
		return nil
	}
	return c.principal
}

// store caches a key read while s.forgets was epoch, unless a revocation
// came since.
func (s *Service) store(keyID string, hash []byte, p *Principal, now time.Time, epoch uint64) {
	if s.cacheTTL <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.forgets != epoch {
		return
	}
	if len(s.cache) >= maxCachedKeys {
		clear(s.cache)
	}
	s.cache[keyID] = cachedKey{hash: hash, principal: p, expires: now.Add(s.cacheTTL)}
}

func (s *Service) forget(keyID string) {
	s.mu.Lock()
	delete(s.cache, keyID)
	s.forgets++
	s.mu.Unlock()
}

// CreateKeyRequest is the body of POST /api/v1/keys.
type CreateKeyRequest struct {
	Name string `json:"name" openapi:"minLength=1,maxLength=100"`
	// Every scope of AllScopes, for the OpenAPI document (a test holds the two in step).
	Scopes []string `json:"scopes,omitempty" openapi:"itemEnum=effects:begin|effects:report|effects:read|effects:resolve|policies:read|policies:write|approvals:write|keys:write|runs:write|runs:read|jobs:work|steps:replay|endpoints:write|contracts:write|webhooks:write|reconcile:write|billing:write"`
	// Preset is optional, but one sent must be a preset: "" is refused, not
	// read as omitted (conformance QA), and so is null.
	Preset jsonx.Optional[string] `json:"preset" openapi:"enum=OPERATOR|AGENT|INGEST|WORKER,notNull"`
	// Each a name@version pair (toolname.RefRule): one '@' between a name
	// and a version of at most toolname.MaxName and MaxVersion characters.
	Tools                   []string `json:"tools,omitempty" openapi:"maxItems=100,itemPattern=^[^@]+@[^@]+$,itemMaxLength=301"` // toolname.MaxPairs
	DailySpendCeilingMicros *int64   `json:"daily_spend_ceiling_micros,omitempty" openapi:"min=0,max=1000000000000000000"`
	RateLimitPerMinute      *int     `json:"rate_limit_per_minute,omitempty" openapi:"min=1,max=1000000"`
}

// resolve validates the request against the creator's own powers and returns
// the new key's scopes and tools.
func (r *CreateKeyRequest) resolve(creator *Principal) (scopes, tools []string, err error) {
	var pr apierr.Problems
	if strings.TrimSpace(r.Name) == "" || utf8.RuneCountInString(r.Name) > 100 {
		pr.Add("name", "must be 1-100 characters")
	}
	preset := r.Preset.Value
	switch {
	case r.Preset.Null:
		pr.Add("preset", "must not be null")
	case r.Preset.Set && r.Scopes != nil:
		pr.Add("preset", "cannot be given with scopes: give one or the other")
	case r.Preset.Set:
		ps, ok := Presets[preset]
		if !ok {
			pr.Add("preset", "must be one of OPERATOR, AGENT, INGEST, WORKER")
		}
		scopes = ps
	case len(r.Scopes) == 0:
		pr.Add("scopes", "must hold at least one scope, unless a preset is given")
	default:
		for i, sc := range r.Scopes {
			if !KnownScope(sc) {
				pr.Add(fmt.Sprintf("scopes.%d", i), "is not a known scope")
			}
		}
		scopes = r.Scopes
	}
	if len(r.Tools) > toolname.MaxPairs {
		pr.Add("tools", "must list at most %d name@version pairs", toolname.MaxPairs)
	}
	for i, t := range r.Tools {
		if !toolname.ValidRef(t) {
			pr.Add(fmt.Sprintf("tools.%d", i), toolname.RefRule)
		}
	}
	if preset == "WORKER" && len(r.Tools) == 0 {
		pr.Add("tools", "must list the exact name@version pairs a WORKER key may register")
	}
	if r.DailySpendCeilingMicros != nil && !money.Valid(*r.DailySpendCeilingMicros) {
		pr.Add("daily_spend_ceiling_micros", money.Rule)
	}
	if r.RateLimitPerMinute != nil && (*r.RateLimitPerMinute < 1 || *r.RateLimitPerMinute > 1_000_000) {
		// In the words 1.5 is told (lib/jsonstrict), as a policy's bounded
		// integers are (QA: 0 read "must be 1-1000000").
		pr.Add("rate_limit_per_minute", "%s", apierr.IntegerRule(1, 1_000_000))
	}
	if err := pr.Err(); err != nil {
		return nil, nil, err
	}
	if err := refuseCappedCreator(creator); err != nil {
		return nil, nil, err
	}
	scopes = normalizeScopes(scopes)
	// A key can never mint a key with powers it does not hold.
	if err := creator.Require(scopes...); err != nil {
		return nil, nil, err
	}
	if r.Tools != nil {
		tools = normalizeScopes(r.Tools)
		if err := creator.coversTools(tools); err != nil {
			return nil, nil, err
		}
	} else if creator.Tools != nil && slices.Contains(scopes, ScopeJobsWork) {
		// An unrestricted worker key would be wider than its creator.
		tools = slices.Clone(creator.Tools)
	}
	return scopes, tools, nil
}

// coversTools answers 403 naming each tool of tools (a key's list; nil for
// every tool, named tool:*) that p, restricted to some tools, may not work:
// a key can neither mint nor revoke a key wider than itself.
func (p *Principal) coversTools(tools []string) error {
	if p.Tools == nil {
		return nil
	}
	if tools == nil {
		return apierr.Forbidden("tool:*")
	}
	var missing []string
	for _, t := range tools {
		if !slices.Contains(p.Tools, t) {
			missing = append(missing, "tool:"+t)
		}
	}
	if missing != nil {
		return apierr.Forbidden(missing...)
	}
	return nil
}

// refuseCappedCreator refuses a key with a spend ceiling or a rate limit the
// minting of keys. Every key has counters of its own, so a capped key's
// children, however capped each, would together spend and call past the
// creator's ceiling and limit (three children of a key capped at 100 micros
// spent 400). Capped keys are for agents; an uncapped key mints them.
func refuseCappedCreator(creator *Principal) error {
	if creator.DailySpendCeilingMicros == nil && creator.RateLimitPerMinute == nil {
		return nil
	}
	// No scope would lift it, so detail.required is empty (every 403
	// forbidden carries the list, API.md §1); detail.reason says what
	// does refuse it (QA: an empty list alone read as nothing missing).
	e := apierr.Forbidden()
	e.Message = "A key with a daily_spend_ceiling_micros or rate_limit_per_minute cannot create keys: their " +
		"spending and requests would not count against its own. Create them with an uncapped key."
	e.Detail["reason"] = "capped_key"
	return e
}

// rootKey is true of a key (row of api_keys, $4 every scope) that is live,
// uncapped and unrestricted and holds every scope: one that can mint any
// other key.
const rootKey = `(revoked_at IS NULL AND daily_spend_ceiling_micros IS NULL AND rate_limit_per_minute IS NULL
    AND tools IS NULL AND scopes @> $4::text[])`

const keyColumns = `id, name, scopes, tools, daily_spend_ceiling_micros, rate_limit_per_minute, created_by_key_id,
    created_at, revoked_at`

func scanKey(row pgx.Row) (Key, error) {
	var k Key
	var rate *int32
	err := row.Scan(&k.ID, &k.Name, &k.Scopes, &k.Tools, &k.DailySpendCeilingMicros, &rate, &k.CreatedByKeyID, &k.CreatedAt,
		&k.RevokedAt)
	// Scopes read in one order whichever way the key was made: a minted
	// key's are sorted, and signup's root key, stored in AllScopes' order
	// before, now is too (QA: a client comparing lists saw a difference).
	slices.Sort(k.Scopes)
	if rate != nil {
		r := int(*rate)
		k.RateLimitPerMinute = &r
	}
	return k, err
}

// mint generates a key id and secret and inserts it through q.
func (s *Service) mint(ctx context.Context, q pgx.Tx, workspaceID, creatorKeyID, name string, scopes, tools []string,
	ceiling *int64, rate *int) (NewKey, error) {
	id := ids.NewAt(ids.Key, s.now())
	secret := secretPrefix + strings.TrimPrefix(id, ids.Key+"_") + "_" + ids.Random(32)
	var creator *string
	if creatorKeyID != "" {
		creator = &creatorKeyID
	}
	k, err := scanKey(q.QueryRow(ctx, `
		INSERT INTO api_keys (id, workspace_id, name, secret_hash, scopes, tools,
		                      daily_spend_ceiling_micros, rate_limit_per_minute, created_by_key_id, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
		RETURNING `+keyColumns,
		id, workspaceID, name, s.Hash(secret), scopes, tools, ceiling, rate, creator, s.now()))
	if err != nil {
		return NewKey{}, fmt.Errorf("insert key: %w", err)
	}
	return NewKey{Key: k, Secret: secret}, nil
}

// CreateKey mints a key in the caller's workspace.
func (s *Service) CreateKey(ctx context.Context, creator *Principal, req CreateKeyRequest) (NewKey, error) {
	scopes, tools, err := req.resolve(creator)
	if err != nil {
		return NewKey{}, err
	}
	var out NewKey
	err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		// The creator's row is held while the key is minted, so a key
		// revoked as its request ran cannot mint one to outlive it (the
		// route's fresh read of the key leaves that moment open).
		if err := RequireLive(ctx, tx, creator.KeyID); err != nil {
			return err
		}
		out, err = s.mint(ctx, tx, creator.WorkspaceID, creator.KeyID, strings.TrimSpace(req.Name), scopes, tools,
			req.DailySpendCeilingMicros, req.RateLimitPerMinute)
		return err
	})
	return out, err
}

// sqlListKeys pages workspace $1's keys after id $2 ("" for the first
// page), $3 at most.
var sqlListKeys = `SELECT ` + keyColumns + ` FROM api_keys
WHERE workspace_id = $1::text AND id > $2::text ORDER BY id LIMIT $3::int`

// sqlListKeysMintedBy is sqlListKeys of the keys key $4 minted. It is a
// statement of its own, not a condition of sqlListKeys that an empty $4
// turns off: a plan made for any value (a prepared statement's generic
// plan) keeps such a condition as a filter (gate.listEffectsIn). The page
// is read from api_keys_created_by_idx (migration 0072), the cursor
// bounding the whole key of that index, as db.NewestFirst bounds a page
// (the same keys as "id > $2"): "id > $2" alone bounds the primary key as
// well, which a generic plan read in id order, every workspace's keys
// after the cursor, keeping the page's (50,000 for a page of none).
var sqlListKeysMintedBy = `SELECT ` + keyColumns + ` FROM api_keys
WHERE workspace_id = $1::text AND created_by_key_id = $4::text
	AND (workspace_id, created_by_key_id, id) > ($1::text, $4::text, $2::text)
ORDER BY workspace_id, created_by_key_id, id LIMIT $3::int`

// listKeysSQL is ListKeys' statement and its arguments.
func listKeysSQL(workspaceID, createdBy, cursor string, limit int) (string, []any) {
	if createdBy != "" {
		return sqlListKeysMintedBy, []any{workspaceID, cursor, limit, createdBy}
	}
	return sqlListKeys, []any{workspaceID, cursor, limit}
}

// ListKeys pages through the workspace's keys by id: every one, or, when
// createdBy is not "", those the key createdBy minted (none when it is
// another workspace's, or no key).
func (s *Service) ListKeys(ctx context.Context, workspaceID, createdBy, cursor string, limit int) ([]Key, error) {
	sql, args := listKeysSQL(workspaceID, createdBy, cursor, limit)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
}

// CurrentKey reads the calling key itself (never its secret). It is read
// from the database, not the instance's cache: one revoked meanwhile, on
// any instance, is refused as a revoked key is (review: another instance
// answered it with its scopes, revoked_at set).
func (s *Service) CurrentKey(ctx context.Context, p *Principal) (Key, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_keys
		WHERE workspace_id = $1 AND id = $2 AND revoked_at IS NULL`, p.WorkspaceID, p.KeyID)
	if err != nil {
		return Key{}, fmt.Errorf("read key: %w", err)
	}
	k, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrRevokedKey()
	}
	if err != nil {
		return Key{}, fmt.Errorf("read key: %w", err)
	}
	return k, nil
}

// RevokeKey revokes a key for good and returns it; revoking twice answers the
// same key. Another instance may accept the key for reads, reports and
// heartbeats for up to KEY_CACHE_TTL; every other call reads it afresh or
// checks it in its own statements. The keys it minted stay live
// (RevokeKeyTree revokes them with it).
//
// A key may revoke only keys whose scopes it holds itself, the rule that
// bounds the keys it may create: otherwise a key with keys:write alone could
// revoke the workspace's OPERATOR key and lock its operators out.
func (s *Service) RevokeKey(ctx context.Context, p *Principal, keyID string) (Key, error) {
	k, _, err := s.revoke(ctx, p, keyID, false)
	return k, err
}

// RevokedKey is what DELETE /api/v1/keys/{id} answers: the revoked key
// and, for a revoke with ?include_minted=true only, the keys revoked with
// it (a plain revoke's answer is the Key, byte for byte).
type RevokedKey struct {
	Key
	MintedRevoked *[]string `json:"minted_revoked,omitempty" jsonschema:"with ?include_minted=true only: the ids of the keys this revoke revoked with the key, sorted: every live key it minted, and every live key those minted, down the tree (empty when none was live); keys revoked before are left out; sent again, the same list: the keys an earlier revoke of this key with its minted keys took, and any it takes itself"`
}

// RevokeKeyTree revokes a key and, transitively, every live key minted
// from it (created_by_key_id: the keys it minted, the keys those minted,
// and so on, through keys revoked already), in one transaction: for a key
// found compromised. Every rule RevokeKey applies to its one key holds for
// each key revoked (the caller holds its scopes, covers its tools when it
// has jobs:work), and the workspace keeps a root key: a key of the tree
// that fails one refuses the whole revoke, naming it in detail.key_id, and
// nothing is revoked. Sent again, it answers the key as RevokeKey does,
// lists again the keys an earlier revoke of its tree took (revoked_with_key_id,
// migration 0074) and revokes any of the tree still live.
func (s *Service) RevokeKeyTree(ctx context.Context, p *Principal, keyID string) (RevokedKey, error) {
	k, minted, err := s.revoke(ctx, p, keyID, true)
	if err != nil {
		return RevokedKey{}, err
	}
	return RevokedKey{Key: k, MintedRevoked: &minted}, nil
}

// sqlLockRevoke locks, in id order in one statement, the keys a revoke of
// key $1 in workspace $2 may revoke, with $3 the keys minted from it
// (sqlKeyTree), every root key (live, uncapped, unrestricted, every
// scope: what signup hands out, and the only kind that can mint every
// other; $4 every scope), so that two revokes of the last two roots cannot
// both see the other one left, and the calling key $5, so that a key
// revoked as its revoke waited revokes nothing (as a mint holds its
// minter's row, RequireLive): two revokes of overlapping trees, or of each
// other's callers, or a revoke and a mint, wait for each other rather than
// deadlock. The last column marks the caller's row.
var sqlLockRevoke = `WITH RECURSIVE ` + sqlKeyTree + `
SELECT id, scopes, tools, revoked_at IS NULL, ` + rootKey + `, id IN (SELECT id FROM tree),
    coalesce(revoked_with_key_id = $1::text, false), id = $5::text FROM api_keys
WHERE workspace_id = $2::text AND (id IN (SELECT id FROM tree) OR ` + rootKey + ` OR id = $5::text)
ORDER BY id FOR UPDATE OF api_keys`

// sqlKeyTree is a recursive query, tree, of key $1 of workspace $2 and,
// when $3, the keys minted from it, revoked or not (a revoked key's
// children may live), each key's read from api_keys_created_by_idx
// (migration 0072): a lateral subquery the planner cannot pull up (OFFSET
// 0), for a join planned as a hash or merge join read the workspace's
// every key once per level of the tree (TestARevokeLocksItsWorkspacesKeysOnly).
const sqlKeyTree = `tree (id) AS (
    SELECT id FROM api_keys WHERE workspace_id = $2::text AND id = $1::text
  UNION
    SELECT m.id FROM tree t CROSS JOIN LATERAL (
        SELECT k.id FROM api_keys k WHERE k.workspace_id = $2::text AND k.created_by_key_id = t.id OFFSET 0) m
    WHERE $3::bool
)`

// sqlReadTree reads sqlKeyTree's ids.
const sqlReadTree = `WITH RECURSIVE ` + sqlKeyTree + ` SELECT id FROM tree`

// lockedKey is a row sqlLockRevoke locked.
type lockedKey struct {
	id               string
	scopes, tools    []string
	live, root, tree bool
	// revokedWith says the key was revoked with the key this revoke
	// names, by a revoke with its minted keys (revoked_with_key_id).
	revokedWith bool
	// caller: the revoking key's own row.
	caller bool
}

// errTreeGrew is revokeIn's when a key of the tree minted a key between
// the lock statement's snapshot and its lock: the revoke runs again, and
// finds it.
var errTreeGrew = errors.New("a key of the tree minted a key as it was locked")

// maxTreeLocks bounds how many times a revoke reads and locks its tree
// again as keys of it go on minting (each time a mint committed as the
// tree was locked).
const maxTreeLocks = 5

// revoke revokes keyID and, when withMinted, the live keys minted from
// it, answering the key and the ids of those (sorted).
func (s *Service) revoke(ctx context.Context, p *Principal, keyID string, withMinted bool) (Key, []string, error) {
	if !ids.Valid(ids.Key, keyID) {
		return Key{}, nil, apierr.NotFound("key")
	}
	var (
		k      Key
		minted []string
		err    error
	)
	for range maxTreeLocks {
		err = db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
			k, minted, err = s.revokeIn(ctx, tx, p, keyID, withMinted)
			return err
		})
		if !errors.Is(err, errTreeGrew) {
			break
		}
	}
	if errors.Is(err, errTreeGrew) {
		return Key{}, nil, apierr.Conflict(apierr.CodeRetryRequest,
			"Keys of this key's tree went on minting keys as it was revoked; retry at once.")
	}
	if err != nil {
		return Key{}, nil, err
	}
	s.forget(keyID)
	for _, id := range minted {
		s.forget(id)
	}
	return k, minted, nil
}

// revokeIn is revoke's transaction.
func (s *Service) revokeIn(ctx context.Context, tx pgx.Tx, p *Principal, keyID string, withMinted bool) (Key, []string, error) {
	rows, err := tx.Query(ctx, sqlLockRevoke, keyID, p.WorkspaceID, withMinted, AllScopes, p.KeyID)
	if err != nil {
		return Key{}, nil, fmt.Errorf("revoke key: %w", err)
	}
	locked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (lockedKey, error) {
		var l lockedKey
		err := r.Scan(&l.id, &l.scopes, &l.tools, &l.live, &l.root, &l.tree, &l.revokedWith, &l.caller)
		return l, err
	})
	if err != nil {
		return Key{}, nil, fmt.Errorf("revoke key: %w", err)
	}
	// The caller, locked: revoked since the request read it (on any
	// instance, or as this revoke waited for a revoke of it), it revokes
	// nothing, as a revoked key is answered on every call that changes
	// something.
	if !slices.ContainsFunc(locked, func(l lockedKey) bool { return l.caller && l.live }) {
		return Key{}, nil, ErrRevokedKey()
	}
	i := slices.IndexFunc(locked, func(l lockedKey) bool { return l.id == keyID })
	if i < 0 {
		return Key{}, nil, apierr.NotFound("key")
	}
	// The key first, as RevokeKey checks it alone, then the live keys
	// minted from it in id order: a revoked one is revoked no more.
	revoking := []lockedKey{locked[i]}
	for _, l := range locked {
		if l.tree && l.live && l.id != keyID {
			revoking = append(revoking, l)
		}
	}
	for _, l := range revoking {
		if err := p.mayRevoke(l); err != nil {
			if e, ok := apierr.As(err); ok && withMinted {
				err = e.WithDetail("key_id", l.id) // which key of the tree
			}
			return Key{}, nil, err
		}
	}
	if err := keepsARoot(locked, withMinted); err != nil {
		return Key{}, nil, err
	}
	if withMinted {
		// A key of the tree may have minted a key between the lock
		// statement's snapshot and its lock (the mint held its row until
		// it committed): read afresh, the tree must hold no key left
		// unlocked. None can be minted now: every live key of it is
		// locked, and a mint holds its minter's row (RequireLive).
		rows, err := tx.Query(ctx, sqlReadTree, keyID, p.WorkspaceID, true)
		if err != nil {
			return Key{}, nil, fmt.Errorf("revoke key: %w", err)
		}
		tree, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return Key{}, nil, fmt.Errorf("revoke key: %w", err)
		}
		inTree := make(map[string]bool, len(locked))
		for _, l := range locked {
			inTree[l.id] = l.tree
		}
		for _, id := range tree {
			if !inTree[id] {
				return Key{}, nil, errTreeGrew
			}
		}
	}
	revokeIDs := make([]string, len(revoking))
	for j, l := range revoking {
		revokeIDs[j] = l.id
	}
	var with *string
	if withMinted {
		with = &keyID
	}
	rows, err = tx.Query(ctx, sqlRevoke, revokeIDs, s.now(), with)
	if err != nil {
		return Key{}, nil, fmt.Errorf("revoke key: %w", err)
	}
	revoked, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	if err != nil {
		return Key{}, nil, fmt.Errorf("revoke key: %w", err)
	}
	var k Key
	for _, r := range revoked {
		if r.ID == keyID {
			k = r
		}
	}
	// The keys it revokes now, and those an earlier revoke of the same
	// key with its minted keys revoked: sent again, its answer lost, the
	// request lists what it took again (retry QA: it answered [], as if
	// the compromised key had minted nothing).
	minted := revokeIDs[1:]
	for _, l := range locked {
		if l.tree && !l.live && l.revokedWith {
			minted = append(minted, l.id)
		}
	}
	slices.Sort(minted)
	return k, minted, nil
}

// mayRevoke refuses p the revoke of key l unless p holds its scopes and,
// for a key with jobs:work, covers its tools.
func (p *Principal) mayRevoke(l lockedKey) error {
	if err := p.Require(l.scopes...); err != nil {
		return err
	}
	if slices.Contains(l.scopes, ScopeJobsWork) {
		// As minting: a key restricted to some tools revokes only keys
		// within them (QA: a key for a@1 revoked a WORKER key for b@1).
		return p.coversTools(l.tools)
	}
	return nil
}

// keepsARoot refuses a revoke of the keys of the tree among locked (which
// hold every live root key: a root is live, so one of the tree is revoked)
// that would leave the workspace no root key.
// Only a root mints a root, and a capped or narrower key cannot mint what
// it lacks: the workspace would lose keys for good (QA, review).
func keepsARoot(locked []lockedKey, withMinted bool) error {
	var kept int
	var first string
	for _, l := range locked {
		switch {
		case !l.root:
		case l.tree: // live, so revoked with the key
			if first == "" {
				first = l.id
			}
		default:
			kept++
		}
	}
	if first == "" || kept > 0 {
		return nil
	}
	if !withMinted {
		return apierr.InvalidState("This is the workspace's last key with every scope, no tools list and no " +
			"ceiling or rate limit; mint another such key before revoking it.")
	}
	return apierr.InvalidState("This would revoke the workspace's last key with every scope, no tools list and no "+
		"ceiling or rate limit (detail.key_id, minted from the key, or the key itself); mint another such key, not "+
		"from this key, before revoking them.").WithDetail("key_id", first)
}

// sqlRevoke revokes keys $1 at $2 (kept when one already was, so a revoke
// sent again answers what the first did), recording on each but key $3
// that it was revoked with $3 (NULL for a plain revoke: nothing recorded) and erases the answers kept for
// their creates' Idempotency-Keys, which show their secrets (linked to
// them by Record; idempotency.EraseAnswers): sent again, such a create is
// answered 404 not_found. It runs after revoke's first statement found and
// locked the keys' rows, so its snapshot holds those answers: a create
// commits its key and its answer together, and a revoke whose lock
// statement began before that commit finds no key (404; a revoke of its
// minter's tree finds it, reading the tree again, and locks again); were
// the erasure a statement before the lock, it could miss an answer the
// lock then found the key of.
var sqlRevoke = `
WITH erased AS (
    ` + idempotency.EraseAnswers("resource_id = ANY($1::text[])") + `
)
UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2::timestamptz),
    revoked_with_key_id = CASE WHEN revoked_at IS NULL AND id <> $3::text THEN $3::text ELSE revoked_with_key_id END
WHERE id = ANY($1::text[]) RETURNING ` + keyColumns

// EraseRevokedAnswers erases up to limit answers kept for an
// Idempotency-Key that show a revoked key's secret: a revoke erases them
// itself (sqlRevoke), but not those the sweeper linked after it (kept
// before migration 0068: idempotency.Store.LinkAnswers, which runs first
// in the same pass), nor those of a key an instance of the release before
// 0068 revoked during the deploy. It answers how many it erased.
func (s *Service) EraseRevokedAnswers(ctx context.Context, limit int) (int, error) {
	tag, err := s.pool.Exec(ctx, sqlEraseRevokedAnswers, limit)
	if err != nil {
		return 0, fmt.Errorf("erase the answers of revoked keys: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// sqlEraseRevokedAnswers is EraseRevokedAnswers' statement: $1 the limit.
var sqlEraseRevokedAnswers = idempotency.EraseGoneAnswers("api_keys", "x.revoked_at IS NOT NULL", "$1::int")

// Workspace is a tenant.
type Workspace struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// Seeder prepares a new workspace inside the signup transaction (starter
// policies, for example).
type Seeder func(ctx context.Context, tx pgx.Tx, workspaceID string) error

// CheckWorkspaceName refuses a workspace name Signup would not take (1 to
// 100 characters as sent, not blank; stored trimmed), for a caller to
// check before it spends anything on the request (the signup rate). The
// length is the one sent, as the OpenAPI document's maxLength reads it: a
// name of 100 characters between spaces was taken though the document
// refused it (review).
func CheckWorkspaceName(name string) error {
	if strings.TrimSpace(name) == "" || utf8.RuneCountInString(name) > 100 {
		return apierr.InvalidField("name", "must be 1-100 characters")
	}
	return nil
}

// Signup creates a workspace and its first OPERATOR key in one transaction,
// running every seeder in it, so a workspace never exists half-made.
func (s *Service) Signup(ctx context.Context, name string, seeders ...Seeder) (Workspace, NewKey, error) {
	if err := CheckWorkspaceName(name); err != nil {
		return Workspace{}, NewKey{}, err
	}
	name = strings.TrimSpace(name)
	now := s.now().UTC().Truncate(time.Microsecond) // as Postgres stores it
	ws := Workspace{ID: ids.NewAt(ids.Workspace, now), Name: name, CreatedAt: now}
	var key NewKey
	err := db.Tx(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)`,
			ws.ID, ws.Name, ws.CreatedAt); err != nil {
			return fmt.Errorf("insert workspace: %w", err)
		}
		var err error
		key, err = s.mint(ctx, tx, ws.ID, "", "operator", normalizeScopes(Presets["OPERATOR"]), nil, nil, nil)
		if err != nil {
			return err
		}
		for _, seed := range seeders {
			if err := seed(ctx, tx, ws.ID); err != nil {
				return fmt.Errorf("seed workspace: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return Workspace{}, NewKey{}, err
	}
	return ws, key, nil
}

// SignupGate enforces SIGNUP_MODE and SIGNUP_RATE_PER_HOUR.
type SignupGate struct {
	Mode        string
	Token       string
	RatePerHour int
}

// SignupTokenMissesPerHour bounds the guesses at SIGNUP_TOKEN: the wrong
// tokens every instance together takes in a clock hour (UTC). Past it,
// every signup that sends a token is refused 429 until the hour ends, the
// right token's too: an answer that told the right token apart would go on
// answering guesses (security QA: any number of guesses were answered 401,
// one at a time, with no limit at all).
const SignupTokenMissesPerHour = 30

// signupTokenBucket counts the wrong SIGNUP_TOKENs sent (rate_counters).
const signupTokenBucket = "signup:token_misses"

// AdmitSignup refuses a signup attempt carrying token that SIGNUP_MODE
// keeps out: 403 when signup is closed, 401 without the token it needs,
// 429 once SignupTokenMissesPerHour wrong tokens were sent this hour.
// Checked before the request's body, as a keyed route checks its key and
// scopes first (QA: a closed signup answered a bad body 400, as if it were
// open). A request sending no token guesses nothing and counts nothing.
func (s *Service) AdmitSignup(ctx context.Context, g SignupGate, token string) error {
	switch g.Mode {
	case "closed":
		// No scope would open it (QA: detail.required named "signup",
		// which is none), so the list every 403 carries is empty.
		e := apierr.Forbidden()
		e.Message = "Signup is closed on this server."
		e.Detail["reason"] = "signup_closed"
		return e
	case "token":
		refused := apierr.Unauthorized("Signup needs a valid Ratchet-Signup-Token header.")
		if token == "" {
			return refused
		}
		// Counted as a miss before it is compared, and refunded if right,
		// so that concurrent guesses cannot all pass the count before any
		// of them is counted.
		ok, retry, window, err := s.limiter.charge(ctx, signupTokenBucket, SignupTokenMissesPerHour, time.Hour)
		if err != nil {
			return err
		}
		if !ok {
			return signupLimited(retry, "Too many wrong signup tokens lately; try again later.")
		}
		if !SharedSecretEqual(token, g.Token) {
			return refused
		}
		if err := s.limiter.refund(ctx, signupTokenBucket, window); err != nil {
			return err
		}
	}
	return nil
}

// SharedSecretEqual reports whether sent is want, a shared secret
// (SIGNUP_TOKEN, CRON_SECRET), in time that tells neither where they differ
// nor want's length: they are compared by their SHA-256 digests, of one
// length, where subtle.ConstantTimeCompare of the two answers at once when
// their lengths differ.
func SharedSecretEqual(sent, want string) bool {
	a, b := sha256.Sum256([]byte(sent)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// signupLimited is a signup's 429, saying what was limited: signup takes
// no key, of which rate_limited's own message speaks.
func signupLimited(retryAfter int, message string) error {
	e := apierr.RateLimited(retryAfter)
	e.Message = message
	return e
}

// CheckSignupRate counts an admitted signup against SIGNUP_RATE_PER_HOUR,
// refusing it (429) past the rate. Checked after the body, so that a
// malformed request spends none of it.
func (s *Service) CheckSignupRate(ctx context.Context, g SignupGate) error {
	if g.RatePerHour > 0 {
		ok, retry, err := s.limiter.Allow(ctx, "signup", g.RatePerHour, time.Hour)
		if err != nil {
			return err
		}
		if !ok {
			return signupLimited(retry, "Too many workspaces created lately; try again later.")
		}
	}
	return nil
}
