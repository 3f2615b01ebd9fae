// Type declarations of @getratchet/sdk (the implementation is plain
// JavaScript, ES modules, no dependencies). They are self-contained: no
// @types/node and no DOM lib needed. fetch and AbortSignal are the
// program's own global types where it has them (lib "dom" or @types/node),
// and otherwise the parts of them the SDK uses (FetchFunction,
// AbortSignalLike).

export declare const VERSION: string;
export declare const AFTER_SUCCEEDED: 'SUCCEEDED';
export declare const AFTER_FAILED: 'FAILED';
export declare const MIN_RETRY_AFTER_MS: 1000;
export declare const MAX_RETRY_AFTER_MS: 86400000;
export declare const MAX_ERROR_MESSAGE_BYTES: 500;

/** What the SDK uses of an AbortSignal: a real one (AbortController's) is one. */
export interface AbortSignalLike {
  readonly aborted: boolean;
  readonly reason: any;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/** The global AbortSignal's type where the program declares one (lib "dom" or
 * @types/node), else AbortSignalLike: a signal the SDK hands out can then be
 * passed on to fetch and the like. */
export type AbortSignal = typeof globalThis extends { AbortSignal: { prototype: infer S } } ? S : AbortSignalLike;

/** What the SDK reads of a fetch answer. */
export interface FetchResponseLike {
  readonly ok: boolean;
  readonly status: number;
  readonly headers: { get(name: string): string | null };
  text(): Promise<string>;
}

/** The global fetch's type where the program declares one (lib "dom" or
 * @types/node), else the call the SDK makes of it. */
export type FetchFunction = typeof globalThis extends { fetch: infer F } ? F
  : (url: string, init: { method: string; headers: Record<string, string>; body: string | undefined; signal: AbortSignalLike }) => Promise<FetchResponseLike>;

/** JSON values as the API takes and answers them. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export interface RatchetOptions {
  /** https://getratchet.app when omitted. A trailing /api/v1 is accepted. */
  baseUrl?: string | undefined;
  /** Read from the environment or a secret store, never from source. */
  apiKey: string;
  /** Per request; 60 000 by default. */
  timeoutMs?: number | undefined;
  /** Repeats of a retryable failure; 3 by default. */
  maxRetries?: number | undefined;
  userAgent?: string | undefined;
  /** Replaces the global fetch (proxies, tracing, tests). */
  fetch?: FetchFunction | undefined;
}

/** The last argument of every Ratchet method that calls the API (but
 * doEffect, whose options hold a signal of its own), as a Go method's
 * context: per call, never merged into a method's own options. */
export interface RequestOptions {
  /** Bounds the whole call, its retries and the waits between them
   * included, in place of the client's timeoutMs: cut mid-attempt it
   * rejects ConnectionLostError ('timed out'); a retry's wait that would
   * end past it is not begun, the call rejecting with its last failure. */
  timeoutMs?: number | undefined;
  /** Aborts the call: it rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

/** RequestOptions of a call sent under an Idempotency-Key of its own (an
 * action whose repeat would undo another actor's change, a policy update). */
export interface KeyedRequestOptions extends RequestOptions {
  /** Sent as the call's Idempotency-Key on every attempt in place of a
   * fresh one: a retry from another process under the first call's key is
   * answered the first answer. */
  idempotencyKey?: string | undefined;
}

export interface RunOptions {
  idempotencyKey?: string | undefined;
  budgetMicros?: number | undefined;
}

export interface EnqueueOptions {
  name: string;
  version: string;
  endpoint?: string | undefined;
  idempotencyKey?: string | undefined;
  timeoutMs?: number | undefined;
  maxAttempts?: number | undefined;
  contractVersion?: number | undefined;
  afterStepId?: string | undefined;
  afterStatus?: 'SUCCEEDED' | 'FAILED' | undefined;
  delayMs?: number | undefined;
  /** Another run than the one startRun started. */
  runId?: string | undefined;
}

export interface EnqueueResult {
  stepId: string;
  jobId: string;
  idempotencyKey: string;
  status: JobStatus;
  dueAt: string | null;
  deduplicated: boolean;
}

/** A page of a durable-job list (camelCase routes); nextCursor is null on the last. */
export interface Page<T> {
  data: T[];
  nextCursor: string | null;
}

/** A page of an effect-gate list (snake_case routes); next_cursor is null on the last. */
export interface GatePage<T> {
  data: T[];
  next_cursor: string | null;
}

/** A job's snapshot of its retry schedule and timeout, taken at enqueue. */
export interface RetryPolicySnapshot {
  preset: 'STANDARD' | 'AGGRESSIVE' | 'RELAXED' | 'CUSTOM';
  /** The effective count, an enqueue override included. */
  maxAttempts: number;
  initialDelayMs: number;
  multiplier: number;
  maxDelayMs: number;
  jitterPercent: number;
  timeoutMs: number;
}

/** One execution (one claim) of a job. */
export interface JobAttempt {
  attempt: number;
  workerId: string;
  /** null while it runs. */
  outcome: 'SUCCEEDED' | 'FAILED' | null;
  /** A failure the server recorded itself (a lapsed lease, a refused output). */
  warning: string | null;
  retryable: boolean | null;
  retryAfterMs: number | null;
  /** The message the worker reported with a failure. */
  errorMessage: string | null;
  /** True when the server cannot decrypt the message (sealed with an encryption key it is no longer configured with): errorMessage is then null. */
  errorMessageUnreadable: boolean;
  startedAt: string;
  leaseExpiresAt: string;
  reportedAt: string | null;
}

/** One replay of a job: who made it, why, what it found and changed. */
export interface JobReplay {
  id: string;
  keyId: string;
  reason: string | null;
  priorStatus: 'EXHAUSTED' | 'CANCELLED';
  priorAttempt: number;
  additionalAttempts: number;
  maxAttempts: number;
  oldHandlerVersion: string;
  newHandlerVersion: string;
  oldContractVersion: number | null;
  newContractVersion: number | null;
  createdAt: string;
}

export type JobStatus = 'WAITING' | 'QUEUED' | 'RUNNING' | 'RETRY_SCHEDULED' | 'SUCCEEDED' | 'EXHAUSTED' | 'CANCELLED' | 'SKIPPED';

/** A step's durable job. */
export interface DurableJob {
  id: string;
  status: JobStatus;
  /** Executions so far. */
  attempt: number;
  maxAttempts: number;
  dueAt: string | null;
  leaseExpiresAt: string | null;
  cancelRequested: boolean;
  /** The endpoint policy version the snapshot was taken from. */
  policyVersion: number;
  policy: RetryPolicySnapshot;
  /** The job's executions in attempt order: its last 50. */
  attempts: JobAttempt[];
  /** attempts holds only the last 50 (replays add attempts without end): listStepAttempts pages them all. */
  attemptsTruncated: boolean;
  /** The job's replays, oldest first: its last 50. */
  replays: JobReplay[];
  /** replays holds only the last 50: listStepReplays pages them all. */
  replaysTruncated: boolean;
}

/** One step of a run; its status equals durableJob.status. */
export interface Step {
  id: string;
  runId: string;
  name: string;
  version: string;
  /** The endpoint's name. */
  endpoint: string;
  status: JobStatus;
  idempotencyKey: string;
  afterStepId: string | null;
  afterStatus: 'SUCCEEDED' | 'FAILED' | null;
  contractVersion: number | null;
  /** Redacted previews (shape only). */
  inputPreview: Json;
  outputPreview: Json;
  createdAt: string;
  finishedAt: string | null;
  durableJob: DurableJob;
}

/** A run without its steps, as listRuns pages them. */
export interface RunSummary {
  id: string;
  name: string;
  status: 'RUNNING' | 'SUCCEEDED' | 'FAILED';
  completionRequested: boolean;
  createdAt: string;
  finishedAt: string | null;
  /** Made by POST /tools/{name}/test. */
  synthetic: boolean;
  budgetMicros: number | null;
  spentMicros: number | null;
  idempotencyKey: string | null;
}

/** A run with (its first 1000) steps. */
export interface Run extends RunSummary {
  steps: Step[];
  /** Only the first steps are here (1000, or fewer where more would pass about 4 MB): listRunSteps pages them all. */
  stepsTruncated: boolean;
  /** startRun only: true when the idempotencyKey had started this run already. */
  deduplicated?: boolean;
}

/** A contract a replay could move to. */
export interface ReplayUpgrade {
  contractVersion: number;
  handlerVersion: string;
  status: 'ACTIVE' | 'FORBIDDEN';
  /** The saved input fits its input schema. */
  compatible: boolean;
  forbidden: boolean;
  /** False when the preview did not check the saved input against it (its check budget ran out first, or inputUnreadable): compatible is then false though it may fit, and a replay onto it checks it. */
  checked: boolean;
  /** Why it does not fit: field paths and rules, never values. */
  validation: Array<{ field: string; message: string }>;
}

export interface ReplayPreview {
  stepId: string;
  jobId: string;
  name: string;
  status: JobStatus;
  eligible: boolean;
  ineligibleReason: string | null;
  /** The step's current handler version: expectedHandlerVersion of an upgrade. */
  handlerVersion: string;
  /** True when every contract of the tool at handlerVersion is FORBIDDEN: a replay of the same version is refused (409 invalid_state), and only one onto an upgrade runs the step (eligible is false when no upgrade can). */
  handlerVersionForbidden: boolean;
  contractVersion: number | null;
  /** Pass as expectedAttempt. */
  attempt: number;
  maxAttempts: number;
  endpointPaused: boolean;
  upgrades: ReplayUpgrade[];
  /** True when the server cannot decrypt the saved input (sealed with an encryption key it is no longer configured with): no upgrade is then compatible, and a replay onto one fails with a 500 until the key is configured again. */
  inputUnreadable: boolean;
}

export interface ReplayResult {
  stepId: string;
  /** The same job. */
  jobId: string;
  status: 'QUEUED';
  /** The last attempt made so far. */
  attempt: number;
  /** The job's lifetime ceiling. */
  maxAttempts: number;
  handlerVersion: string;
}

export interface ReplayOptions {
  reason?: string | undefined;
  /** Additional executions allowed; 1 by default. */
  maxAttempts?: number | undefined;
  /** Must stay true: a replay may repeat a side effect. */
  acknowledgeDuplicateRisk?: true | undefined;
  targetContractVersion?: number | undefined;
  expectedHandlerVersion?: string | undefined;
  acknowledgeVersionChange?: boolean | undefined;
  /** The preview's attempt: refuses a replay of a step that ran since. */
  expectedAttempt?: number | undefined;
}

export type CancelReason = 'timeout' | 'cancelled' | 'lease_lost' | 'stopping';

export interface JobContext {
  jobId: string;
  stepId: string;
  runId: string;
  name: string;
  version: string;
  attempt: number;
  /** The job's ceiling: attempt === maxAttempts is the last execution (unless replayed); 0 from a server that does not say. */
  maxAttempts: number;
  /** Pass it to the destination so a repeated attempt is deduplicated there. */
  idempotencyKey: string;
  timeoutMs: number;
  /** Aborted at the job's timeout, at the server's request, when the lease is lost, or when the worker stops. */
  signal: AbortSignal;
  readonly cancelReason: CancelReason | null;
}

export type ErrorDecision = { retryable: true; retryAfterMs?: number | undefined } | { retryable: false };

export interface Tool<In = any, Out = any> {
  name: string;
  version: string;
  handler: (input: In, context: JobContext) => Out | Promise<Out>;
  classifyError?: (error: unknown, context: JobContext) => ErrorDecision;
}

export interface StartOptions {
  concurrency?: number | undefined;
  /** The idle wait between claims; 30 000 by default. */
  pollIntervalMs?: number | undefined;
  /** 0-20: each claim long-polls on the server. */
  waitSeconds?: number | undefined;
  /** Called in order with what the worker cannot hand to anyone else (failed
   * registrations, claims and heartbeats, leases lost, reports not recorded, classifier
   * failures); its errors may hold payload details. Without it, each problem
   * goes to console.warn as one line holding none of the error's text (a
   * RatchetError's status, code and request id; a lost connection's kind;
   * the call's method, host and path; else only its name; a report not
   * recorded with report=, job_id= and attempt= first): the first at once,
   * then at most a line a minute counting those left out,
   * "recovered after N failures" once a registration or claim succeeds, the
   * refusal that stops the worker at once ("ratchet worker refused: ..."),
   * and when it stops a last line counting those left out, if any. */
  onError?: ((error: unknown) => void | Promise<void>) | undefined;
  /** Aborting it stops the worker as stop() does. */
  signal?: AbortSignal | undefined;
  /** Once a stop's deadline passed, how long aborted handlers have to return
   * and be reported, and then how much longer the reports are sent;
   * 10 000 by default, as the Go and Python workers'. */
  stopGraceMs?: number | undefined;
}

export declare class Worker {
  /** Use Ratchet.worker. */
  private constructor();
  workerId: string | null;
  /** Registers (waiting out an outage: failures that may pass go to onError
   * and are tried again with backoff, for as long as the worker runs), then
   * resolves once the worker has stopped, its running jobs ended and onError
   * been told what the stop gave up (waited for up to 1 s, as stop() waits); rejects
   * with Ratchet's own refusal of a registration (a proxy's bare 400, 401
   * or 404, no error envelope, is waited out as a 5xx is), or with the RatchetError when it stopped
   * because the server refused it for good (a 401 to any call; a claim
   * refused 403, 400, 409, 422...; a registration refused, or a 404 again,
   * after a claim's 404): its running handlers are then aborted at once,
   * and it rejects once onError has been told (waited for up to 1 s). */
  start(options?: StartOptions): Promise<void>;
  /** Resolves to whether every claimed job ended with its outcome recorded
   * or settled elsewhere (a report refused lease_lost, say) and no handler
   * is still running; true before start(). A handler still running
   * stopGraceMs after its signal aborted at the stop's deadline is left
   * unreported (its lease lapses and the job runs again), and onError is
   * told so once, as a ReportNotRecordedError naming the job; one whose
   * lease was lost or whose job the server cancelled (before the stop or
   * during its grace) is waited for until the deadline too and left
   * running after the same grace, nothing told
   * (a newer attempt holds the job, or it runs no more); with no deadline
   * (Infinity) the grace starts at the stop's call, or at the loss if
   * later, as under Go's Stop without a deadline. */
  stop(options?: { timeoutMs?: number | undefined }): Promise<boolean>;
  // timeoutMs: Infinity sets no deadline (2^31-1 ms, as any longer one), as Go's Stop under a context without one.
}

export interface BeginRequest {
  effectType: string;
  idempotencyKey: string;
  payload?: Json | undefined;
  costMicros?: number | undefined;
  dimensions?: Record<string, string> | undefined;
  runId?: string | undefined;
  groupId?: string | undefined;
  compensation?: { effect_type: string; payload: Json } | undefined;
  compensatesEffectId?: string | undefined;
  leaseSeconds?: number | undefined;
  /** Made for each call. Pass your own only to span begins whose answer was
   * lost; never once an action may have run under its lease (a doEffect that
   * returned, a crashed process): while that lease is live its begin is
   * handed the same execute, and the action runs twice. */
  requestId?: string | undefined;
}

/** The earlier attempt behind a blocked or probe decision. */
export interface PriorAttempt {
  attempt: number;
  started_at: string | null;
  lease_expired_at: string | null;
}

/** Why an effect was denied (its error's code). */
export type DenialCode = 'policy_denied' | 'budget_exceeded' | 'cost_ceiling_exceeded' | 'run_budget_exceeded'
  | 'key_budget_exceeded' | 'dimension_limit_exceeded' | 'max_attempts_exceeded' | 'approval_rejected' | 'circuit_open';

export type EffectState = 'leased' | 'succeeded' | 'failed' | 'indeterminate' | 'awaiting_approval' | 'denied';

/** One attempt in an effect's history (snake_case, as on the wire). */
export interface EffectAttempt {
  attempt: number;
  /** null while leased. */
  outcome: 'succeeded' | 'failed' | 'indeterminate' | null;
  /** Granted to find out what an unknown attempt did. */
  probe: boolean;
  started_at: string;
  lease_expires_at: string;
  reported_at: string | null;
  began_by_key_id: string;
  reported_by_key_id: string | null;
  resolved_by_key_id: string | null;
  resolved_at: string | null;
  /** The resolve's note ("reconciliation" or "probe" when those settled it). */
  resolve_note: string | null;
}

/** The gate's record of one idempotency key (snake_case, as on the wire). */
export interface Effect {
  id: string;
  effect_type: string;
  idempotency_key: string;
  state: EffectState;
  /** Execute grants so far. */
  attempt: number;
  attempts: EffectAttempt[];
  /** The recorded result (single reads; lists show result_preview only). */
  result: Json;
  /** True when the server cannot decrypt the recorded result (sealed with an encryption key it is no longer configured with): result is then null, on single reads and in lists alike. */
  result_unreadable: boolean;
  result_preview: Json;
  payload_preview: Json;
  cost_micros: number | null;
  run_id: string | null;
  group_id: string | null;
  compensates_effect_id: string | null;
  denial_code: DenialCode | null;
  approval_id: string | null;
  /** The live lease's expiry while leased. */
  lease_expires_at: string | null;
  created_at: string;
  updated_at: string;
}

export interface ResolveRequest {
  outcome: 'succeeded' | 'failed';
  /** What the vendor recorded: a later duplicate begin answers it. */
  result?: Json | undefined;
  note?: string | undefined;
  /** The attempt verified: the effect's latest attempt whose outcome reads
   * 'indeterminate', as read. Sent, the resolve applies only to it; naming
   * another is 409 invalid_state (detail.unresolved_attempt names the one
   * unknown now), so a retried resolve never settles a later attempt.
   * Left out, resolveEffect reads the effect first and sends its latest
   * attempt reading 'indeterminate' (none when no attempt does, or the key
   * may not read effects). */
  attempt?: number | undefined;
}

/** The gate's answer (snake_case, as on the wire). */
export interface BeginResponse {
  decision: 'execute' | 'duplicate' | 'in_flight' | 'blocked' | 'approval_required' | 'denied';
  effect_id: string;
  state: EffectState;
  attempt: number;
  lease_token?: string;
  lease_expires_at?: string;
  probe?: boolean;
  prior_attempt?: PriorAttempt;
  result?: Json;
  retry_after_seconds?: number;
  approval_id?: string;
  /** A denial's error envelope (HTTP 403), beside the decision fields. */
  error?: { code: string; message: string; detail: Record<string, unknown> };
}

export interface Lease {
  effectId: string;
  attempt: number;
  /** Check the vendor for priorAttempt first, then perform or report what you found. */
  probe: boolean;
  priorAttempt: PriorAttempt | null;
  leaseExpiresAt: string;
  /** Aborted when the lease was lost (the outcome will not be recorded), or
   * when doEffect's own signal aborted (what the action did is reported). */
  signal: AbortSignal;
}

export interface EffectOutcome<T> {
  effectId: string;
  attempt: number;
  /** The action's result, or for a duplicate the result recorded earlier
   * (the same shape when every caller of the key runs the same action):
   * an action that returns undefined gives null, what was recorded and
   * what a duplicate answers. */
  result: T;
  duplicate: boolean;
}

/** limit (1–200, default 50) and cursor (the previous page's next cursor). */
export interface ListQuery {
  limit?: number | undefined;
  cursor?: string | undefined;
}

/** A dimension's daily ceilings (snake_case, as on the wire), as a policy
 * answers them: both fields, null for no bound. */
export interface DimensionLimit {
  daily_micros: number | null;
  daily_count: number | null;
}

/** A dimension's daily ceilings as updateEffectPolicy sends them, as the
 * server takes them: either field may be left out or null (no bound), not
 * both (400 invalid_request at dimension_limits.<name>: it would limit
 * nothing); daily_micros 0 to 10^18, daily_count at least 1, no other field.
 * A DimensionLimit read from a policy with either field set is one. */
export type DimensionLimitUpdate =
  | { daily_micros: number; daily_count?: number | null | undefined }
  | { daily_micros?: number | null | undefined; daily_count: number };

/** How closely an effect type's declared costs crowd its watch line (snake_case, as on the wire). */
export interface Structuring {
  effect_type: string;
  /** structuring_threshold_micros, else max_cost_micros, else null (then only declarations are counted). */
  threshold_micros: number | null;
  threshold_from: 'structuring_threshold_micros' | 'max_cost_micros' | null;
  as_of: string;
  /** The last 24 hours, then 7 days. */
  windows: Array<{
    hours: number;
    declared: number;
    below_80_percent: number | null;
    from_80_to_90_percent: number | null;
    from_90_to_100_percent: number | null;
    at_or_above: number | null;
    /** from_90_to_100_percent / declared: null without a line or declarations. */
    share_just_below: number | null;
  }>;
}

/** An effect type's policy (snake_case, as on the wire); version 0 and
 * updated_at null for a type still on the safe default. An amount (the
 * *_micros fields, up to 10^18) above 2^53 micros is read as JSON.parse reads
 * any number, rounded to the nearest double (by up to 64 micros): send
 * updateEffectPolicy only the fields you change, not the policy read back. */
export interface EffectPolicy {
  effect_type: string;
  version: number;
  mode: 'allow' | 'require_approval' | 'deny';
  on_indeterminate: 'block' | 'retry' | 'probe';
  lease_seconds: number;
  max_attempts: number;
  max_cost_micros: number | null;
  approval_above_micros: number | null;
  daily_budget_micros: number | null;
  reconcile_every_hours: number | null;
  require_cost: boolean;
  required_dimensions: string[];
  dimension_limits: Record<string, DimensionLimit>;
  structuring_threshold_micros: number | null;
  surge_per_hour: number | null;
  surge_multiplier: number | null;
  surge_action: 'monitor' | 'require_approval' | 'deny';
  surge_cooldown_seconds: number;
  retention_days: number;
  updated_at: string | null;
  /** When the type was last reconciled (reconcile), null before the first;
   * its reconcile_every_hours calendar restarts there. Read-only. */
  last_reconciled_at: string | null;
}

/** What updateEffectPolicy merges into a policy (the API's snake_case fields): a field left
 * out is kept, null clears a nullable one (required_dimensions and dimension_limits included),
 * and a list or map sent, required_dimensions or dimension_limits, replaces the stored one whole:
 * a dimension left out of dimension_limits loses its limit. effect_type, version, updated_at and last_reconciled_at are not fields of an update: the
 * server refuses a body naming one. */
export type EffectPolicyUpdate = Partial<Omit<EffectPolicy,
  'effect_type' | 'version' | 'updated_at' | 'last_reconciled_at' | 'required_dimensions' | 'dimension_limits'>> & {
  required_dimensions?: string[] | null | undefined;
  dimension_limits?: Record<string, DimensionLimitUpdate> | null | undefined;
};

/** Why an effect was held for approval: its policy's mode, a breaker or the
 * emergency stop holding its type with require_approval, or a cost at or
 * above approval_above_micros. */
export type ApprovalReason = 'policy_requires_approval' | 'cost_at_or_above_threshold' | 'circuit_open';

/** An approval (snake_case, as on the wire). */
export interface Approval {
  id: string;
  effect_id: string;
  effect_type: string;
  state: 'pending' | 'approved' | 'rejected';
  /** Why it was asked. */
  reason: ApprovalReason;
  created_at: string;
  decided_at: string | null;
  note: string | null;
  /** The reasons the decision answered; null while pending. */
  answers: ApprovalReason[] | null;
  /** The key that decided it (approved or rejected it, or closed it by a resolution or an unwind); null while pending, and for one no key decided. */
  decided_by_key_id: string | null;
  /** The held effect's declared cost, what the approval says yes to; null when it declared none. */
  cost_micros: number | null;
  /** The held effect's idempotency key. */
  idempotency_key: string;
}

export type BreakerAction = 'monitor' | 'require_approval' | 'deny';

/** An effect type's breaker (snake_case, as on the wire). */
export interface Circuit {
  effect_type: string;
  state: 'closed' | 'open';
  opened_by: 'surge' | 'manual' | 'stop' | null;
  action: BreakerAction | null;
  reason: string | null;
  volume_last_hour: number;
  baseline_median_hourly: number | null;
  threshold: number | null;
  opened_at: string | null;
  closes_at: string | null;
}

/** The emergency stop's state. */
export interface EmergencyStop {
  state: 'closed' | 'open';
  action: BreakerAction | null;
  reason: string | null;
  opened_at: string | null;
}

export type GroupState = 'open' | 'committed' | 'unwinding' | 'unwound' | 'unwind_failed';

/** One effect of a group. */
export interface GroupStep {
  effect_id: string;
  effect_type: string;
  idempotency_key: string;
  state: EffectState;
  has_compensation: boolean;
  compensates_effect_id: string | null;
}

/** A compensation group (snake_case, as on the wire). */
export interface Group {
  id: string;
  name: string;
  state: GroupState;
  created_at: string;
  /** Its last change of state. */
  updated_at: string;
  committed_at: string | null;
  unwind_started_at: string | null;
  finished_at: string | null;
  idempotency_key: string | null;
  /** Its effects, forward and compensating, in effect id order: all of them unless steps_truncated. */
  steps: GroupStep[];
  /** steps holds only the first that fit in one answer (about 4 MB: some 3 000 steps at worst):
   * listGroupSteps pages them all (pass the last one's effect_id as cursor for the rest). */
  steps_truncated: boolean;
  /** createGroup only: true when its idempotency key had opened it already. */
  deduplicated?: boolean;
}

/** One compensation to perform, under its suggested idempotency key. */
export interface PlanItem {
  effect_id: string;
  compensation: { effect_type: string; payload: Json };
  suggested_idempotency_key: string;
  compensates_effect_id: string;
  compensation_effect_id: string | null;
  compensation_state: EffectState | null;
}

/** commitGroup's answer: the group, with its id as group_id, and an empty plan. */
export interface GroupCommit extends Group {
  group_id: string;
  plan: PlanItem[];
  unresolved: string[];
}

/** unwindGroup's answer: the plan, newest success first. */
export interface Unwind {
  group_id: string;
  state: GroupState;
  plan: PlanItem[];
  /** The plan holds only its first items: the rest would take the answer past about 4 MB
   * (a compensation's payload may be 1 MiB). Perform them, then unwind again for the rest. */
  plan_truncated: boolean;
  /** Effects whose outcome is unknown: resolve them first. */
  unresolved: string[];
  /** Succeeded effects declared without a compensation. */
  irreversible: string[];
  reversed: string[];
}

export type WebhookEventType = 'effect.indeterminate' | 'circuit.tripped' | 'circuit.closed' | 'approval.requested'
  | 'approval.decided' | 'reconciliation.due' | 'run.finished' | 'step.exhausted' | 'step.replayed';

/** A webhook (no secret). */
export interface Webhook {
  id: string;
  url: string;
  events: WebhookEventType[];
  created_at: string;
  /** While a rotated-out secret still verifies. */
  previous_secret_expires_at: string | null;
  /**
   * True when the server cannot decrypt the signing secret (sealed with an encryption key it is
   * not configured with, or damaged): no delivery is sent with it meanwhile.
   */
  secret_unreadable: boolean;
  /**
   * True while it is disabled (updateWebhook): nothing is sent to it, its pending deliveries wait
   * (at most as long as the server keeps events, then they end failed, `expired while disabled`)
   * and the events recorded meanwhile are skipped.
   */
  disabled: boolean;
  /** When it was disabled; null while it is enabled. */
  disabled_at: string | null;
}

/** What updateWebhook changes: each field given; the others are kept. Give at least one. */
export interface WebhookUpdate {
  /** The new receiver: every delivery not yet sent goes to it. */
  url?: string | undefined;
  /** The event types subscribed to, in place of the current ones (pending deliveries of a type left out end failed). */
  events?: WebhookEventType[] | undefined;
  /** true disables it (sent nothing until enabled again), false enables it again. */
  disabled?: boolean | undefined;
}

/** A webhook as created or rotated: its secret, shown once. */
export interface NewWebhook extends Webhook {
  secret: string;
}

/** One event's delivery to a webhook. */
export interface WebhookDelivery {
  id: string;
  event_id: string;
  event_type: WebhookEventType;
  state: 'pending' | 'delivered' | 'failed';
  attempts: number;
  last_status_code: number | null;
  last_error: string | null;
  next_attempt_at: string | null;
  created_at: string;
  delivered_at: string | null;
}

/** A scope an API key holds. */
export type Scope = 'effects:begin' | 'effects:report' | 'effects:read' | 'effects:resolve' | 'policies:read'
  | 'policies:write' | 'approvals:write' | 'keys:write' | 'runs:write' | 'runs:read' | 'jobs:work' | 'steps:replay'
  | 'endpoints:write' | 'contracts:write' | 'webhooks:write' | 'reconcile:write' | 'billing:write';

/** An API key (no secret). */
export interface ApiKey {
  id: string;
  name: string;
  scopes: Scope[];
  /** The name@version pairs a worker key may serve; null for any. */
  tools: string[] | null;
  daily_spend_ceiling_micros: number | null;
  rate_limit_per_minute: number | null;
  /** The key that minted this one; null for a workspace's signup key.
   * Revoking a key leaves the keys it minted live: list them with
   * listKeys({ createdBy }), or revoke them with it:
   * revokeKey(id, { includeMinted: true }). */
  created_by_key_id: string | null;
  created_at: string;
  revoked_at: string | null;
}

/** revokeKey's answer: the revoked key and, with { includeMinted: true }
 * only, minted_revoked: the ids (sorted) of the keys revoked with it, every
 * live key minted from it down the tree (keys revoked before are left
 * out; empty when none was live; sent again, the first call's list
 * again, with any key it takes itself). */
export interface RevokedApiKey extends ApiKey {
  minted_revoked?: string[];
}

/** revokeKey's options: a request's, and includeMinted. */
export interface RevokeKeyOptions extends RequestOptions {
  /** true revokes every live key minted from the key with it
   * (?include_minted=true); false or left out, the key alone. */
  includeMinted?: boolean | undefined;
}

/** A key as created: its secret, shown once. */
export interface NewApiKey extends ApiKey {
  secret: string;
}

export interface KeySpec {
  name: string;
  preset?: 'OPERATOR' | 'AGENT' | 'INGEST' | 'WORKER' | undefined;
  scopes?: string[] | undefined;
  tools?: string[] | null | undefined;
  dailySpendCeilingMicros?: number | undefined;
  rateLimitPerMinute?: number | undefined;
  /** Random when omitted; spans the call's retries. */
  idempotencyKey?: string | undefined;
}

/** An endpoint's CUSTOM retry schedule. */
export interface RetrySchedule {
  preset: 'STANDARD' | 'AGGRESSIVE' | 'RELAXED' | 'CUSTOM';
  maxAttempts: number;
  initialDelayMs: number;
  multiplier: number;
  maxDelayMs: number;
  jitterPercent: number;
}

export interface EndpointCircuit {
  state: 'closed' | 'open';
  openedAt: string | null;
  probeAt: string | null;
  consecutiveFailures: number;
}

/** An endpoint with its policy (camelCase, as on the wire). */
export interface Endpoint {
  id: string;
  name: string;
  /** The policy's version, for updateEndpointPolicy's expectedVersion. */
  version: number;
  policyPreset: 'STANDARD' | 'AGGRESSIVE' | 'RELAXED' | 'CUSTOM';
  /** The CUSTOM schedule; null for a named preset. */
  retryPolicy: RetrySchedule | null;
  maxAttempts: number;
  defaultTimeoutMs: number;
  maxConcurrent: number | null;
  rateLimitPerMinute: number | null;
  paused: boolean;
  circuitFailureThreshold: number | null;
  circuitCooldownMs: number;
  circuit: EndpointCircuit;
  createdAt: string;
  updatedAt: string;
}

/** Policy fields as the API takes them (camelCase): preset, maxAttempts,
 * initialDelayMs, multiplier, maxDelayMs, jitterPercent, defaultTimeoutMs,
 * maxConcurrent, rateLimitPerMinute, circuitFailureThreshold, circuitCooldownMs. */
export type EndpointPolicyUpdate = Record<string, Json>;

/** One attempt of a job on an endpoint. */
export interface EndpointAttempt extends JobAttempt {
  jobId: string;
  stepId: string;
  runId: string;
  name: string;
  version: string;
}

/** One name@version queue. */
export interface QueueHealth {
  name: string;
  version: string;
  queued: number;
  due: number;
  oldestQueuedAgeSeconds: number;
  workersSeen: number;
  openCircuitEndpoints: string[];
  pausedEndpoints: string[];
  atConcurrencyLimitEndpoints: string[];
  rateLimitedEndpoints: string[];
  /** Why nothing claims it, when nothing does. */
  message: string | null;
}

/** A tool's contract (camelCase, as on the wire). */
export interface Contract {
  name: string;
  contractVersion: number;
  handlerVersion: string;
  inputSchema: Json;
  outputSchema: Json;
  timeoutMs: number;
  retryPreset: 'STANDARD' | 'AGGRESSIVE' | 'RELAXED' | 'CUSTOM';
  retryPolicy: RetrySchedule | null;
  status: 'ACTIVE' | 'FORBIDDEN';
  createdAt: string;
}

export interface ContractSpec {
  handlerVersion: string;
  inputSchema: Json;
  outputSchema?: Json | undefined;
  timeoutMs?: number | undefined;
  retryPreset?: 'STANDARD' | 'AGGRESSIVE' | 'RELAXED' | 'CUSTOM' | undefined;
  retryPolicy?: { maxAttempts: number; initialDelayMs: number; multiplier: number; maxDelayMs: number; jitterPercent: number } | undefined;
  status?: 'ACTIVE' | 'FORBIDDEN' | undefined;
  /** Random when omitted; spans the call's retries. */
  idempotencyKey?: string | undefined;
}

/** testTool's answer: the synthetic one-attempt job. */
export interface ToolTest {
  runId: string;
  stepId: string;
  jobId: string;
  name: string;
  version: string;
  contractVersion: number | null;
  status: JobStatus;
  maxAttempts: number;
  dueAt: string | null;
}

/** A vendor record's status. */
export type VendorStatus = 'succeeded' | 'refunded' | 'failed' | 'pending';

export interface ReconcileRecord {
  idempotencyKey: string;
  status: VendorStatus;
  amountMicros?: number | undefined;
}

export interface ReconcileRequest {
  effectType: string;
  from: Date | string;
  to: Date | string;
  records?: ReconcileRecord[] | undefined;
  /** Random when omitted; spans the call's retries. */
  idempotencyKey?: string | undefined;
}

/** One key's comparison (snake_case, as on the wire). */
export interface ReconcileItem {
  idempotency_key: string;
  effect_id: string | null;
  ratchet_state: EffectState | null;
  vendor_status: VendorStatus | null;
  ratchet_amount_micros: number | null;
  vendor_amount_micros: number | null;
  /** What a resolved item was settled as. */
  outcome?: 'succeeded' | 'failed';
}

export interface ReconcileCounts {
  matched: number;
  missing_at_vendor: number;
  unknown_to_ratchet: number;
  amount_mismatch: number;
  resolved: number;
  status_mismatch: number;
  unsettled: number;
}

export interface Reconciliation {
  effect_type: string;
  from: string;
  to: string;
  reconciled_at: string;
  counts: ReconcileCounts;
  matched: ReconcileItem[];
  missing_at_vendor: ReconcileItem[];
  unknown_to_ratchet: ReconcileItem[];
  amount_mismatch: ReconcileItem[];
  resolved: ReconcileItem[];
  status_mismatch: ReconcileItem[];
  unsettled: ReconcileItem[];
}

/** A job leased by claim (the worker runtime's own claims aside): what a
 * handler's context says of it, and the lease. */
export interface ClaimedJob extends Pick<JobContext, 'jobId' | 'stepId' | 'runId' | 'name' | 'version' | 'attempt'
  | 'maxAttempts' | 'idempotencyKey' | 'timeoutMs'> {
  /** Proves this claim in heartbeatJob and reportJob. */
  leaseToken: string;
  leaseExpiresAt: string;
  /** The lease's length, which each heartbeat extends it by from then. */
  leaseMs: number;
  input: Json;
}

/** An attempt's outcome for reportJob. */
export interface JobReport {
  leaseToken: string;
  status: 'SUCCEEDED' | 'FAILED';
  output?: Json | undefined;
  /** retryAfterMs 1000-86400000, only with retryable. */
  error?: { message: string; retryable: boolean; retryAfterMs?: number | undefined } | undefined;
}

export interface JobReportResult {
  jobId: string;
  status: JobStatus;
  attempt: number;
  /** When a scheduled retry is due. */
  nextDueAt: string | null;
}

/** One report's answer in reportJobs: its result, or error, the RatchetError a single report would have thrown
 * (status and attempt are then left out; its requestId the batch response's). */
export interface BatchJobResult extends Partial<JobReportResult> {
  jobId: string;
  /** null too for a report refused. */
  nextDueAt: string | null;
  error: RatchetError | null;
}

export declare class Ratchet {
  constructor(options: RatchetOptions);
  readonly runId: string | null;
  readonly worker: Worker;
  request<T = any>(method: string, path: string, body?: unknown, options?: RequestOptions & { safe?: boolean | undefined; idempotencyKey?: string | undefined }): Promise<T>;
  startRun(name: string, options?: RunOptions, requestOptions?: RequestOptions): Promise<Run>;
  enqueue(input: unknown, options: EnqueueOptions, requestOptions?: RequestOptions): Promise<EnqueueResult>;
  finishRun(runId?: string, requestOptions?: RequestOptions): Promise<Run>;
  getRun(runId?: string, requestOptions?: RequestOptions): Promise<Run>;
  listRuns(query?: { status?: 'RUNNING' | 'SUCCEEDED' | 'FAILED' | undefined; limit?: number | undefined; cursor?: string | undefined }, requestOptions?: RequestOptions): Promise<Page<RunSummary>>;
  listRunSteps(runId?: string, query?: { status?: JobStatus | undefined; limit?: number | undefined; cursor?: string | undefined }, requestOptions?: RequestOptions): Promise<Page<Step>>;
  getStep(stepId: string, requestOptions?: RequestOptions): Promise<Step>;
  listStepAttempts(stepId: string, query?: ListQuery, requestOptions?: RequestOptions): Promise<Page<JobAttempt>>;
  listStepReplays(stepId: string, query?: ListQuery, requestOptions?: RequestOptions): Promise<Page<JobReplay>>;
  cancelStep(stepId: string, requestOptions?: KeyedRequestOptions): Promise<Step>;
  replayPreview(stepId: string, requestOptions?: RequestOptions): Promise<ReplayPreview>;
  replay(stepId: string, options?: ReplayOptions, requestOptions?: RequestOptions): Promise<ReplayResult>;
  registerTool<In = any, Out = any>(tool: Tool<In, Out>): void;
  begin(request: BeginRequest, requestOptions?: RequestOptions): Promise<BeginResponse>;
  reportEffect(effectId: string, leaseToken: string, outcome: 'succeeded' | 'failed', result?: Json, requestOptions?: RequestOptions): Promise<Effect>;
  heartbeatEffect(effectId: string, leaseToken: string, requestOptions?: RequestOptions): Promise<{ effect_id: string; lease_expires_at: string }>;
  getEffect(effectId: string, requestOptions?: RequestOptions): Promise<Effect>;
  resolveEffect(effectId: string, request: ResolveRequest, requestOptions?: RequestOptions): Promise<Effect>;
  listEffects(query?: { state?: EffectState | undefined; effectType?: string | undefined; limit?: number | undefined; cursor?: string | undefined }, requestOptions?: RequestOptions): Promise<GatePage<Effect>>;
  listEffectPolicies(query?: ListQuery, requestOptions?: RequestOptions): Promise<GatePage<EffectPolicy>>;
  getEffectPolicy(effectType: string, requestOptions?: RequestOptions): Promise<EffectPolicy>;
  getPolicyStructuring(effectType: string, requestOptions?: RequestOptions): Promise<Structuring>;
  updateEffectPolicy(effectType: string, update: EffectPolicyUpdate, options?: { expectedVersion?: number | undefined }, requestOptions?: KeyedRequestOptions): Promise<EffectPolicy>;
  listApprovals(query?: ListQuery & { state?: Approval['state'] | undefined }, requestOptions?: RequestOptions): Promise<GatePage<Approval>>;
  getApproval(approvalId: string, requestOptions?: RequestOptions): Promise<Approval>;
  approve(approvalId: string, options?: { note?: string | undefined }, requestOptions?: RequestOptions): Promise<Approval>;
  reject(approvalId: string, options?: { note?: string | undefined }, requestOptions?: RequestOptions): Promise<Approval>;
  listCircuits(query?: ListQuery, requestOptions?: RequestOptions): Promise<GatePage<Circuit>>;
  openCircuit(effectType: string, options?: { action?: BreakerAction | undefined; reason?: string | undefined }, requestOptions?: KeyedRequestOptions): Promise<Circuit>;
  closeCircuit(effectType: string, requestOptions?: KeyedRequestOptions): Promise<Circuit>;
  emergencyStop(options?: { action?: BreakerAction | undefined; reason?: string | undefined }, requestOptions?: KeyedRequestOptions): Promise<GatePage<Circuit>>;
  getEmergencyStop(requestOptions?: RequestOptions): Promise<EmergencyStop>;
  releaseEmergencyStop(requestOptions?: KeyedRequestOptions): Promise<GatePage<Circuit>>;
  createGroup(name: string, options?: { idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<Group>;
  getGroup(groupId: string, requestOptions?: RequestOptions): Promise<Group>;
  listGroupSteps(groupId: string, query?: ListQuery, requestOptions?: RequestOptions): Promise<GatePage<GroupStep>>;
  commitGroup(groupId: string, requestOptions?: RequestOptions): Promise<GroupCommit>;
  unwindGroup(groupId: string, requestOptions?: RequestOptions): Promise<Unwind>;
  createWebhook(url: string, events: WebhookEventType[], options?: { idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<NewWebhook>;
  listWebhooks(query?: ListQuery, requestOptions?: RequestOptions): Promise<GatePage<Webhook>>;
  getWebhook(webhookId: string, requestOptions?: RequestOptions): Promise<Webhook>;
  updateWebhook(webhookId: string, update: WebhookUpdate, requestOptions?: KeyedRequestOptions): Promise<Webhook>;
  deleteWebhook(webhookId: string, requestOptions?: RequestOptions): Promise<Webhook>;
  listWebhookDeliveries(webhookId: string, query?: ListQuery, requestOptions?: RequestOptions): Promise<GatePage<WebhookDelivery>>;
  retryWebhookDeliveries(webhookId: string, deliveryIds: string[], options?: { idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<{ deliveries: WebhookDelivery[] }>;
  rotateWebhookSecret(webhookId: string, options?: { previousExpiresInSeconds?: number | undefined; replacePrevious?: boolean | undefined; idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<NewWebhook>;
  createKey(spec: KeySpec, requestOptions?: RequestOptions): Promise<NewApiKey>;
  listKeys(query?: ListQuery & { createdBy?: string | undefined }, requestOptions?: RequestOptions): Promise<GatePage<ApiKey>>;
  currentKey(requestOptions?: RequestOptions): Promise<ApiKey>;
  revokeKey(keyId: string, requestOptions?: RevokeKeyOptions): Promise<RevokedApiKey>;
  listEndpoints(query?: ListQuery, requestOptions?: RequestOptions): Promise<Page<Endpoint>>;
  createEndpoint(name: string, policy?: EndpointPolicyUpdate, requestOptions?: RequestOptions): Promise<Endpoint>;
  getEndpoint(endpointId: string, requestOptions?: RequestOptions): Promise<Endpoint>;
  updateEndpointPolicy(endpointId: string, update: EndpointPolicyUpdate, options: { expectedVersion: number }, requestOptions?: RequestOptions): Promise<Endpoint>;
  pauseEndpoint(endpointId: string, requestOptions?: KeyedRequestOptions): Promise<Endpoint>;
  resumeEndpoint(endpointId: string, requestOptions?: KeyedRequestOptions): Promise<Endpoint>;
  closeEndpointCircuit(endpointId: string, requestOptions?: KeyedRequestOptions): Promise<Endpoint>;
  listEndpointAttempts(endpointId: string, query?: ListQuery & { outcome?: 'SUCCEEDED' | 'FAILED' | undefined }, requestOptions?: RequestOptions): Promise<Page<EndpointAttempt>>;
  publishContract(name: string, spec: ContractSpec, requestOptions?: RequestOptions): Promise<Contract>;
  listContracts(name: string, query?: ListQuery, requestOptions?: RequestOptions): Promise<Page<Contract>>;
  testTool(name: string, version: string, input?: Json, options?: { idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<ToolTest>;
  reconcile(request: ReconcileRequest, requestOptions?: RequestOptions): Promise<Reconciliation>;
  listQueueHealth(query?: ListQuery, requestOptions?: RequestOptions): Promise<Page<QueueHealth>>;
  registerWorker(tools: Array<{ name: string; version: string }>, options?: { idempotencyKey?: string | undefined }, requestOptions?: RequestOptions): Promise<string>;
  claim(workerId: string, options?: { limit?: number | undefined; waitSeconds?: number | undefined; claimId?: string | undefined }, requestOptions?: RequestOptions): Promise<ClaimedJob[]>;
  heartbeatJob(jobId: string, leaseToken: string, requestOptions?: RequestOptions): Promise<{ leaseExpiresAt: string; cancelRequested: boolean }>;
  reportJob(jobId: string, report: JobReport, requestOptions?: RequestOptions): Promise<JobReportResult>;
  reportJobs(reports: Array<JobReport & { jobId: string }>, requestOptions?: RequestOptions): Promise<BatchJobResult[]>;
  doEffect<T>(request: BeginRequest, action: (lease: Lease) => T | Promise<T>, options?: { inFlightTimeoutMs?: number | undefined; signal?: AbortSignal | undefined }): Promise<EffectOutcome<Exclude<T, undefined | void> | (undefined extends T ? null : never)>>;
}

export declare function createRatchet(options: RatchetOptions): Ratchet;
export declare function blindKey(secret: string, key: string): string;
export declare function redactMessage(message: string): string;

/** What a webhook delivery carries (snake_case, as on the wire): ids and
 * states, never payloads. */
export interface WebhookEvent {
  /** The same in every attempt: deduplicate by it. */
  id: string;
  type: WebhookEventType;
  created_at: string;
  workspace_id: string;
  /** What the event is about: an effect, run, step, approval, effect type or endpoint ("*" for the emergency stop). */
  subject_id: string;
  /** The event's details: ids, states, counts and times, by type; never payloads. */
  data: { [key: string]: Json };
}

export interface VerifyWebhookOptions {
  /** How far the signed time may be from now; 300 by default (and when 0 or less). */
  toleranceSeconds?: number | undefined;
  /** The receiver's clock: a Date or milliseconds since 1970; Date.now() by default. */
  now?: Date | number | undefined;
}

/**
 * Checks a delivery's Ratchet-Signature header over its raw body with the
 * subscription's secret (read without the ASCII white space around it: one
 * read from a file with its line end verifies), refuses a signed time
 * beyond the tolerance, and
 * returns the decoded event. `body` is the bytes received, or as a string
 * the raw body text exactly as received (never JSON.stringify of a parsed
 * body). Throws WebhookSignatureError (forged, malformed, stale) or
 * NoWebhookSecretError (no secret: a misconfiguration); a verified body that
 * is not an event as the three SDKs read one, strictly (README), throws a
 * plain Error.
 */
export declare function verifyWebhook(
  secret: string | undefined | null,
  /** The Ratchet-Signature header: req.headers['ratchet-signature'] (a list is joined, as Node joins a repeated header). */
  signature: string | readonly string[] | undefined | null,
  body: Uint8Array | ArrayBuffer | string,
  options?: VerifyWebhookOptions,
): WebhookEvent;

export declare class RatchetError extends Error {
  constructor(status: number, code: string, message: string, detail?: Record<string, any>, requestId?: string, body?: unknown);
  status: number;
  code: string;
  /** The server's explanation alone ("" when it gave none); `message` is the whole text, status, code and request id included. */
  serverMessage: string;
  detail: Record<string, any>;
  requestId: string;
  body: unknown;
  readonly retryAfterSeconds: number;
  /** detail.required of a 403 forbidden: the scopes (or `tool:name@version`) the key lacks; [] otherwise. */
  readonly required: string[];
  /** detail.any_of of a 403 forbidden from a route that any one of several scopes opens (holding one is enough); [] otherwise. */
  readonly anyOf: string[];
  /** detail.resets_at of a budget_exceeded, key_budget_exceeded or dimension_limit_exceeded denial, or null. */
  readonly resetsAt: string | null;
  /** detail.dimension of a dimension_limit_exceeded denial, or null. */
  readonly dimension: string | null;
  /** detail.validation of a 400 invalid_request: each refused field and what is wrong with it (API.md). */
  readonly validation: Array<{ field: string; message: string; [key: string]: unknown }>;
  /** A 5xx that may have acted, or an answer that ended the retries of a call an earlier attempt of which may have. */
  readonly mayHaveApplied: boolean;
}
export declare class ConnectionLostError extends Error {
  constructor(message: string, options?: { cause?: unknown });
}
export declare class RetryableError extends Error {
  /** retryAfterMs is rounded up and clamped into 1 000-86 400 000; never throws. */
  constructor(message: string, options?: { retryAfterMs?: number | undefined });
  retryAfterMs: number | undefined;
}
export declare class NonRetryableError extends Error {
  constructor(message: string);
}
export declare class CancelledError extends Error {
  constructor(reason: CancelReason);
  reason: CancelReason;
}
export declare class InvalidDecisionError extends Error {
  constructor(tool: string, decision: unknown, clamped?: boolean);
  tool: string;
  decision: unknown;
  clamped: boolean;
}
export declare class ReportNotRecordedError extends Error {
  constructor(message: string, options?: { jobId?: string; attempt?: number; what?: 'not_recorded' | 'output_refused' | 'retrying'; cause?: unknown });
  /** The job whose report was not recorded ('' when not said). */
  jobId: string;
  attempt: number;
  /** 'not_recorded', or 'output_refused' when a failure was reported instead of an output the server refused, or
   * 'retrying' when nothing is lost yet: its delivery keeps failing for a reason that may pass and is still retried
   * (told every 30 s while it does). */
  what: 'not_recorded' | 'output_refused' | 'retrying';
  /** The call's error (a RatchetError, a ConnectionLostError), when there is one. */
  cause?: unknown;
}
/** Given to a worker's onError when a job's attempt lost its lease while its
 * handler ran (aborted as 'lease_lost'): a heartbeat refused for good (cause
 * is the RatchetError), or the lease passed its end while heartbeats failed
 * (no cause). */
export declare class LeaseLostError extends Error {
  constructor(options: { jobId: string; attempt: number; tool: string; cause?: unknown });
  jobId: string;
  attempt: number;
  /** The handler's 'name@version'. */
  tool: string;
  /** The heartbeat's refusal; undefined when the lease lapsed. */
  cause?: unknown;
}
export declare class EffectBlockedError extends Error {
  constructor(effectId: string, priorAttempt?: BeginResponse['prior_attempt'] | null);
  effectId: string;
  priorAttempt: BeginResponse['prior_attempt'] | null;
}
export declare class ApprovalRequiredError extends Error {
  constructor(effectId: string, approvalId: string);
  effectId: string;
  approvalId: string;
}
export declare class EffectDeniedError extends Error {
  constructor(effectId: string, error: RatchetError);
  effectId: string;
  code: string;
  error: RatchetError;
  /** The answer's X-Request-Id, to quote to support. */
  requestId: string;
}
export declare class EffectInFlightError extends Error {
  constructor(effectId: string, options?: { cause?: unknown });
  effectId: string;
}
export declare class NotPerformedError extends Error {
  constructor(message: string, options?: { cause?: unknown });
  /** Set when reporting the failure failed too (the lease then lapses). */
  reportError?: unknown;
}
export declare class ResultNotStoredError extends Error {
  constructor(effectId: string, reason: string, result: unknown);
  effectId: string;
  reason: string;
  result: unknown;
}
export declare class WebhookSignatureError extends Error {
  constructor(reason: string);
  /** Which check failed ("malformed Ratchet-Signature", "no v1 signature matches", "signed 6m40s ago, beyond 5m0s"...). */
  reason: string;
}
export declare class NoWebhookSecretError extends Error {
  constructor();
}
export declare class OutcomeNotReportedError extends Error {
  constructor(effectId: string, result: unknown, cause: unknown);
  effectId: string;
  /** The action's result: the action succeeded. */
  result: unknown;
}
