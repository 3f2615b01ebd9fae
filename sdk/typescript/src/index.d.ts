// Type declarations of @getratchet/sdk (the implementation is plain
// JavaScript, ES modules, no dependencies). fetch and AbortSignal are
// Node's globals (Node 18+).
/// <reference types="node" />

export declare const VERSION: string;
export declare const AFTER_SUCCEEDED: 'SUCCEEDED';
export declare const AFTER_FAILED: 'FAILED';
export declare const MIN_RETRY_AFTER_MS: 1000;
export declare const MAX_RETRY_AFTER_MS: 86400000;
export declare const MAX_ERROR_MESSAGE_BYTES: 500;

/** JSON values as the API takes and answers them. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export interface RatchetOptions {
  /** https://getratchet.app when omitted. */
  baseUrl?: string;
  /** Read from the environment or a secret store, never from source. */
  apiKey: string;
  /** Per request; 60 000 by default. */
  timeoutMs?: number;
  /** Repeats of a retryable failure; 3 by default. */
  maxRetries?: number;
  userAgent?: string;
  /** Replaces the global fetch (proxies, tracing, tests). */
  fetch?: typeof fetch;
}

export interface RunOptions {
  idempotencyKey?: string;
  budgetMicros?: number;
}

export interface EnqueueOptions {
  name: string;
  version: string;
  endpoint?: string;
  idempotencyKey?: string;
  timeoutMs?: number;
  maxAttempts?: number;
  contractVersion?: number;
  afterStepId?: string;
  afterStatus?: 'SUCCEEDED' | 'FAILED';
  delayMs?: number;
  /** Another run than the one startRun started. */
  runId?: string;
}

export interface EnqueueResult {
  stepId: string;
  jobId: string;
  idempotencyKey: string;
  status: string;
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
  startedAt: string;
  leaseExpiresAt: string;
  reportedAt: string | null;
}

/** One replay of a job: who made it, why, what it found and changed. */
export interface JobReplay {
  id: string;
  keyId: string;
  reason: string | null;
  priorStatus: string;
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
  attempts: JobAttempt[];
  replays: JobReplay[];
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
  /** Only the first 1000 steps are here: listRunSteps pages them all. */
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
  contractVersion: number | null;
  /** Pass as expectedAttempt. */
  attempt: number;
  maxAttempts: number;
  endpointPaused: boolean;
  upgrades: ReplayUpgrade[];
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
  reason?: string;
  /** Additional executions allowed; 1 by default. */
  maxAttempts?: number;
  /** Must stay true: a replay may repeat a side effect. */
  acknowledgeDuplicateRisk?: true;
  targetContractVersion?: number;
  expectedHandlerVersion?: string;
  acknowledgeVersionChange?: boolean;
  /** The preview's attempt: refuses a replay of a step that ran since. */
  expectedAttempt?: number;
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
  concurrency?: number;
  /** The idle wait between claims; 30 000 by default. */
  pollIntervalMs?: number;
  /** 0-20: each claim long-polls on the server. */
  waitSeconds?: number;
  onError?: (error: unknown) => void | Promise<void>;
  /** Aborting it stops the worker as stop() does. */
  signal?: AbortSignal;
}

export declare class Worker {
  /** Use Ratchet.worker. */
  private constructor();
  workerId: string | null;
  /** Resolves once the worker has stopped and its running jobs ended; rejects with the
   * RatchetError (status 401) when it stopped because the server refused its key. */
  start(options?: StartOptions): Promise<void>;
  /** Resolves to whether every claimed job ended with its outcome recorded
   * or settled elsewhere (a report refused lease_lost, say) and no handler
   * is still running; true before start(). */
  stop(options?: { timeoutMs?: number }): Promise<boolean>;
}

export interface BeginRequest {
  effectType: string;
  idempotencyKey: string;
  payload?: Json;
  costMicros?: number;
  dimensions?: Record<string, string>;
  runId?: string;
  groupId?: string;
  compensation?: { effect_type: string; payload: Json };
  compensatesEffectId?: string;
  leaseSeconds?: number;
  /** Made for each call. Pass your own only to span begins whose answer was
   * lost; never once an action may have run under its lease (a doEffect that
   * returned, a crashed process): while that lease is live its begin is
   * handed the same execute, and the action runs twice. */
  requestId?: string;
}

/** The earlier attempt behind a blocked or probe decision. */
export interface PriorAttempt {
  attempt: number;
  started_at: string | null;
  lease_expired_at: string | null;
}

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
  result_preview: Json;
  payload_preview: Json;
  cost_micros: number | null;
  run_id: string | null;
  group_id: string | null;
  compensates_effect_id: string | null;
  denial_code: string | null;
  approval_id: string | null;
  /** The live lease's expiry while leased. */
  lease_expires_at: string | null;
  created_at: string;
  updated_at: string;
}

export interface ResolveRequest {
  outcome: 'succeeded' | 'failed';
  /** What the vendor recorded: a later duplicate begin answers it. */
  result?: Json;
  note?: string;
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
  error?: { code: string; message: string; detail?: Record<string, unknown> };
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
   * (the same shape when every caller of the key runs the same action). */
  result: T;
  duplicate: boolean;
}

export declare class Ratchet {
  constructor(options: RatchetOptions);
  readonly runId: string | null;
  readonly worker: Worker;
  request<T = any>(method: string, path: string, body?: unknown, options?: { safe?: boolean; idempotencyKey?: string }): Promise<T>;
  startRun(name: string, options?: RunOptions): Promise<Run>;
  enqueue(input: unknown, options: EnqueueOptions): Promise<EnqueueResult>;
  finishRun(runId?: string): Promise<Run>;
  getRun(runId?: string): Promise<Run>;
  listRuns(query?: { status?: 'RUNNING' | 'SUCCEEDED' | 'FAILED'; limit?: number; cursor?: string }): Promise<Page<RunSummary>>;
  listRunSteps(runId?: string, query?: { status?: JobStatus; limit?: number; cursor?: string }): Promise<Page<Step>>;
  getStep(stepId: string): Promise<Step>;
  cancelStep(stepId: string): Promise<Step>;
  replayPreview(stepId: string): Promise<ReplayPreview>;
  replay(stepId: string, options?: ReplayOptions): Promise<ReplayResult>;
  registerTool<In = any, Out = any>(tool: Tool<In, Out>): void;
  begin(request: BeginRequest): Promise<BeginResponse>;
  reportEffect(effectId: string, leaseToken: string, outcome: 'succeeded' | 'failed', result?: Json): Promise<Effect>;
  heartbeatEffect(effectId: string, leaseToken: string): Promise<{ effect_id: string; lease_expires_at: string }>;
  getEffect(effectId: string): Promise<Effect>;
  resolveEffect(effectId: string, request: ResolveRequest): Promise<Effect>;
  listEffects(query?: { state?: EffectState; effectType?: string; limit?: number; cursor?: string }): Promise<GatePage<Effect>>;
  doEffect<T>(request: BeginRequest, action: (lease: Lease) => T | Promise<T>, options?: { inFlightTimeoutMs?: number; signal?: AbortSignal }): Promise<EffectOutcome<T>>;
}

export declare function createRatchet(options: RatchetOptions): Ratchet;
export declare function blindKey(secret: string, key: string): string;
export declare function redactMessage(message: string): string;

/** What a webhook delivery carries (snake_case, as on the wire): ids and
 * states, never payloads. */
export interface WebhookEvent {
  /** The same in every attempt: deduplicate by it. */
  id: string;
  type: string;
  created_at: string;
  workspace_id: string;
  /** What the event is about: an effect, run, step, approval, effect type or endpoint ("*" for the emergency stop). */
  subject_id: string;
  data: Json;
}

export interface VerifyWebhookOptions {
  /** How far the signed time may be from now; 300 by default (and when 0 or less). */
  toleranceSeconds?: number;
  /** The receiver's clock: a Date or milliseconds since 1970; Date.now() by default. */
  now?: Date | number;
}

/**
 * Checks a delivery's Ratchet-Signature header over its raw body with the
 * subscription's secret, refuses a signed time beyond the tolerance, and
 * returns the decoded event. `body` is the bytes received, or as a string
 * the raw body text exactly as received (never JSON.stringify of a parsed
 * body). Throws WebhookSignatureError (forged, malformed, stale) or
 * NoWebhookSecretError (no secret: a misconfiguration).
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
  constructor(message: string);
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
