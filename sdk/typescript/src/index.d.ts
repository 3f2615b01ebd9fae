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

/** The gate's answer (snake_case, as on the wire). */
export interface BeginResponse {
  decision: 'execute' | 'duplicate' | 'in_flight' | 'blocked' | 'approval_required' | 'denied';
  effect_id: string;
  state: string;
  attempt: number;
  lease_token?: string;
  lease_expires_at?: string;
  probe?: boolean;
  prior_attempt?: { attempt: number; started_at: string; lease_expired_at: string };
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
  priorAttempt: BeginResponse['prior_attempt'] | null;
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
  startRun(name: string, options?: RunOptions): Promise<any>;
  enqueue(input: unknown, options: EnqueueOptions): Promise<EnqueueResult>;
  finishRun(runId?: string): Promise<any>;
  getRun(runId?: string): Promise<any>;
  getStep(stepId: string): Promise<any>;
  cancelStep(stepId: string): Promise<any>;
  replayPreview(stepId: string): Promise<any>;
  replay(stepId: string, options?: ReplayOptions): Promise<any>;
  registerTool<In = any, Out = any>(tool: Tool<In, Out>): void;
  begin(request: BeginRequest): Promise<BeginResponse>;
  reportEffect(effectId: string, leaseToken: string, outcome: 'succeeded' | 'failed', result?: Json): Promise<any>;
  heartbeatEffect(effectId: string, leaseToken: string): Promise<{ effect_id: string; lease_expires_at: string }>;
  getEffect(effectId: string): Promise<any>;
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
