"""The answers of the client's methods, as TypedDicts.

Each answer is still the plain dict the API's JSON decodes to: these types
only tell a type checker (mypy, pyright) and an editor its fields, as the
TypeScript SDK's interfaces and the Go SDK's structs do. A field whose
values the server enumerates is typed Literal[...] (its alias, such as
EffectState or GroupState, named here for annotating one's own code). Field names are the
server's own: snake_case on the effect gate's routes, camelCase on the job
routes. A field typed Optional[...] may hold None (the server sends null); a
field a class declares under ``total=False`` may be absent (a begin's
lease_token is sent with an execute only). The served OpenAPI document
(GET /api/v1/openapi.json) is what they mirror: the SDK's tests compare each
with it, so a field the server adds or drops fails them.
"""

from typing import Any, Dict, List, Literal, Optional, TypedDict

from .errors import PriorAttempt, RatchetError, ValidationProblem

# -- the enumerated values ------------------------------------------------
# Each is the enum of the served OpenAPI document (tests/test_types.py
# compares them).

Decision = Literal["execute", "duplicate", "in_flight", "blocked", "approval_required", "denied"]
"""A begin's decision."""
EffectState = Literal["leased", "succeeded", "failed", "indeterminate", "awaiting_approval", "denied"]
"""An effect's state."""
AttemptOutcome = Literal["succeeded", "failed", "indeterminate"]
"""How an attempt at an effect ended (None while leased)."""
ReportOutcome = Literal["succeeded", "failed"]
"""The outcome an effect is reported or resolved with."""
DenialCode = Literal["policy_denied", "budget_exceeded", "cost_ceiling_exceeded", "run_budget_exceeded",
                     "key_budget_exceeded", "dimension_limit_exceeded", "max_attempts_exceeded", "approval_rejected",
                     "circuit_open"]
"""Why an effect was denied (its error's code)."""
PolicyMode = Literal["allow", "require_approval", "deny"]
"""What a policy does with a begin of its type."""
OnIndeterminate = Literal["block", "retry", "probe"]
"""What a begin meets whose key's last attempt's outcome is unknown."""
BreakerAction = Literal["monitor", "require_approval", "deny"]
"""What begins meet while a breaker or the emergency stop holds their type."""
ThresholdFrom = Literal["structuring_threshold_micros", "max_cost_micros"]
"""The policy field a structuring line comes from."""
ApprovalState = Literal["pending", "approved", "rejected"]
"""An approval's state."""
ApprovalReason = Literal["policy_requires_approval", "cost_at_or_above_threshold", "circuit_open"]
"""Why an effect was held for approval."""
CircuitState = Literal["closed", "open"]
"""A breaker's state, or the emergency stop's."""
CircuitOpenedBy = Literal["surge", "manual", "stop"]
"""What opened a breaker: a surge, an operator, or the emergency stop."""
GroupState = Literal["open", "committed", "unwinding", "unwound", "unwind_failed"]
"""A compensation group's state."""
WebhookEventType = Literal["effect.indeterminate", "circuit.tripped", "circuit.closed", "approval.requested",
                           "approval.decided", "reconciliation.due", "run.finished", "step.exhausted",
                           "step.replayed"]
"""A webhook event's type."""
DeliveryState = Literal["pending", "delivered", "failed"]
"""A webhook delivery's state."""
Scope = Literal["effects:begin", "effects:report", "effects:read", "effects:resolve", "policies:read",
                "policies:write", "approvals:write", "keys:write", "runs:write", "runs:read", "jobs:work",
                "steps:replay", "endpoints:write", "contracts:write", "webhooks:write", "reconcile:write",
                "billing:write"]
"""A scope an API key holds."""
VendorStatus = Literal["succeeded", "refunded", "failed", "pending"]
"""A vendor record's status, as reconcile was given it."""
JobStatus = Literal["WAITING", "QUEUED", "RUNNING", "RETRY_SCHEDULED", "SUCCEEDED", "EXHAUSTED", "CANCELLED",
                   "SKIPPED"]
"""A job's status, and its step's (API.md §3)."""
RunStatus = Literal["RUNNING", "SUCCEEDED", "FAILED"]
"""A run's status."""
ContractStatus = Literal["ACTIVE", "FORBIDDEN"]
"""A contract's status: FORBIDDEN refuses new steps and replays onto it."""
RetryPreset = Literal["STANDARD", "AGGRESSIVE", "RELAXED", "CUSTOM"]
"""A retry preset (a contract's, an endpoint's, a schedule's): a built-in
schedule, or CUSTOM (its retryPolicy)."""
JobOutcome = Literal["SUCCEEDED", "FAILED"]
"""A job attempt's outcome, once reported (a lapsed lease reads FAILED)."""
AfterStatus = Literal["SUCCEEDED", "FAILED"]
"""The ending of its dependency a step runs after (enqueue's after_status,
AFTER_SUCCEEDED or AFTER_FAILED)."""

# -- shared --------------------------------------------------------------


class ErrorBody(TypedDict):
    """An error's envelope, {"code", "message", "detail"}: a denied begin's
    ``error`` (its code the reason)."""
    code: str
    message: str
    detail: Dict[str, Any]


# -- the effect gate ------------------------------------------------------


class _BeginFields(TypedDict):
    decision: Decision
    effect_id: str
    state: EffectState
    attempt: int


class BeginResponse(_BeginFields, total=False):
    """begin's answer. ``decision``: execute (with lease_token,
    lease_expires_at, probe and, for a probe, prior_attempt), duplicate
    (with the recorded result), in_flight (with retry_after_seconds),
    blocked (with prior_attempt), approval_required (with approval_id) or
    denied (with error, whose code is the reason)."""
    lease_token: str
    lease_expires_at: str
    probe: bool
    prior_attempt: PriorAttempt
    result: Any
    retry_after_seconds: int
    approval_id: str
    error: ErrorBody


class EffectAttempt(TypedDict):
    """One attempt at an effect: who began it, how it ended and, for one an
    operator resolved, who and why."""
    attempt: int
    began_by_key_id: str
    started_at: str
    lease_expires_at: str
    probe: bool
    outcome: Optional[AttemptOutcome]
    reported_at: Optional[str]
    reported_by_key_id: Optional[str]
    resolved_at: Optional[str]
    resolved_by_key_id: Optional[str]
    resolve_note: Optional[str]


class Effect(TypedDict):
    """An effect with its attempts (get_effect, report_effect,
    resolve_effect, list_effects' items). ``result`` is the recorded result
    where the key may read it, ``result_preview`` and ``payload_preview``
    redacted previews."""
    id: str
    effect_type: str
    idempotency_key: str
    state: EffectState
    attempt: int
    attempts: List[EffectAttempt]
    cost_micros: Optional[int]
    run_id: Optional[str]
    group_id: Optional[str]
    compensates_effect_id: Optional[str]
    approval_id: Optional[str]
    denial_code: Optional[DenialCode]
    lease_expires_at: Optional[str]
    payload_preview: Any
    result: Any
    result_preview: Any
    result_unreadable: bool
    created_at: str
    updated_at: str


class EffectPage(TypedDict):
    data: List[Effect]
    next_cursor: Optional[str]


class EffectHeartbeat(TypedDict):
    """heartbeat_effect's answer: the lease's new end."""
    effect_id: str
    lease_expires_at: str


class DimensionLimit(TypedDict):
    """A policy's daily limit on one dimension's value (either may be None)."""
    daily_micros: Optional[int]
    daily_count: Optional[int]


class EffectPolicy(TypedDict):
    """An effect type's policy (an unconfigured type reads as the safe
    default, version 0)."""
    effect_type: str
    mode: PolicyMode
    version: int
    max_cost_micros: Optional[int]
    approval_above_micros: Optional[int]
    daily_budget_micros: Optional[int]
    structuring_threshold_micros: Optional[int]
    require_cost: bool
    required_dimensions: List[str]
    dimension_limits: Dict[str, DimensionLimit]
    max_attempts: int
    lease_seconds: int
    on_indeterminate: OnIndeterminate
    reconcile_every_hours: Optional[int]
    last_reconciled_at: Optional[str]
    retention_days: int
    surge_action: BreakerAction
    surge_cooldown_seconds: int
    surge_multiplier: Optional[int]
    surge_per_hour: Optional[int]
    updated_at: Optional[str]


class EffectPolicyPage(TypedDict):
    data: List[EffectPolicy]
    next_cursor: Optional[str]


class StructuringWindow(TypedDict):
    """The declared costs of one window, by how close they came to the
    watch line (the counts None without a line)."""
    hours: int
    declared: int
    below_80_percent: Optional[int]
    from_80_to_90_percent: Optional[int]
    from_90_to_100_percent: Optional[int]
    at_or_above: Optional[int]
    share_just_below: Optional[float]


class Structuring(TypedDict):
    """get_policy_structuring's answer: a measure, never enforced."""
    effect_type: str
    threshold_micros: Optional[int]
    threshold_from: Optional[ThresholdFrom]
    as_of: str
    windows: List[StructuringWindow]


class Approval(TypedDict):
    """An approval of one effect: pending, approved or rejected."""
    id: str
    effect_id: str
    effect_type: str
    state: ApprovalState
    reason: ApprovalReason
    answers: Optional[List[ApprovalReason]]
    note: Optional[str]
    created_at: str
    decided_at: Optional[str]
    # The key that decided it; None while pending, and for one no key decided.
    decided_by_key_id: Optional[str]
    # The held effect's: what the approval says yes to (cost None: none declared).
    cost_micros: Optional[int]
    idempotency_key: str


class ApprovalPage(TypedDict):
    data: List[Approval]
    next_cursor: Optional[str]


class Circuit(TypedDict):
    """An effect type's breaker."""
    effect_type: str
    state: CircuitState
    action: Optional[BreakerAction]
    reason: Optional[str]
    opened_by: Optional[CircuitOpenedBy]
    opened_at: Optional[str]
    closes_at: Optional[str]
    threshold: Optional[int]
    volume_last_hour: int
    baseline_median_hourly: Optional[float]


class CircuitPage(TypedDict):
    data: List[Circuit]
    next_cursor: Optional[str]


class EmergencyStop(TypedDict):
    """Whether the emergency stop is on ("open") or off ("closed")."""
    state: CircuitState
    action: Optional[BreakerAction]
    reason: Optional[str]
    opened_at: Optional[str]


class GroupStep(TypedDict):
    """One effect of a compensation group."""
    effect_id: str
    effect_type: str
    idempotency_key: str
    state: EffectState
    has_compensation: bool
    compensates_effect_id: Optional[str]


class GroupStepPage(TypedDict):
    data: List[GroupStep]
    next_cursor: Optional[str]


class _GroupFields(TypedDict):
    id: str
    name: str
    state: GroupState
    idempotency_key: Optional[str]
    steps: List[GroupStep]
    steps_truncated: bool
    created_at: str
    updated_at: str
    committed_at: Optional[str]
    unwind_started_at: Optional[str]
    finished_at: Optional[str]


class Group(_GroupFields, total=False):
    """A compensation group with its steps (``deduplicated``: only in
    create_group's answer)."""
    deduplicated: bool


class Compensation(TypedDict):
    """The effect that undoes a step: begin it to compensate."""
    effect_type: str
    payload: Any


class PlanItem(TypedDict):
    """One compensation of a rollback's plan, in reverse order of success."""
    effect_id: str
    compensates_effect_id: str
    compensation: Compensation
    suggested_idempotency_key: str
    compensation_effect_id: Optional[str]
    compensation_state: Optional[EffectState]


class _GroupCommitFields(_GroupFields):
    group_id: str
    plan: List[PlanItem]
    unresolved: List[str]


class GroupCommit(_GroupCommitFields, total=False):
    """commit_group's answer: the group, with the plan and unresolved
    effects an unwind names (both empty for a commit)."""
    deduplicated: bool


class Unwind(TypedDict):
    """unwind_group's answer: the rollback as it stands."""
    group_id: str
    state: GroupState
    plan: List[PlanItem]
    plan_truncated: bool
    reversed: List[str]
    irreversible: List[str]
    unresolved: List[str]


# -- webhooks and keys ----------------------------------------------------


class Webhook(TypedDict):
    """A webhook subscription (never its secret)."""
    id: str
    url: str
    events: List[WebhookEventType]
    disabled: bool
    disabled_at: Optional[str]
    previous_secret_expires_at: Optional[str]
    secret_unreadable: bool
    created_at: str


class NewWebhook(Webhook):
    """A subscription with its signing secret, shown only in the answers of
    create_webhook and rotate_webhook_secret."""
    secret: str


class WebhookPage(TypedDict):
    data: List[Webhook]
    next_cursor: Optional[str]


class WebhookDelivery(TypedDict):
    """One event's delivery to a subscription."""
    id: str
    event_id: str
    event_type: WebhookEventType
    state: DeliveryState
    attempts: int
    last_status_code: Optional[int]
    last_error: Optional[str]
    next_attempt_at: Optional[str]
    delivered_at: Optional[str]
    created_at: str


class WebhookDeliveryPage(TypedDict):
    data: List[WebhookDelivery]
    next_cursor: Optional[str]


class RetriedDeliveries(TypedDict):
    """retry_webhook_deliveries' answer: the deliveries as they now are."""
    deliveries: List[WebhookDelivery]


class WebhookEvent(TypedDict):
    """A verified webhook delivery's event (verify_webhook); deduplicate by
    ``id``."""
    id: str
    type: WebhookEventType
    subject_id: str
    workspace_id: str
    created_at: str
    data: Dict[str, Any]


class ApiKey(TypedDict):
    """An API key (never its secret)."""
    id: str
    name: str
    scopes: List[Scope]
    tools: Optional[List[str]]
    daily_spend_ceiling_micros: Optional[int]
    rate_limit_per_minute: Optional[int]
    #: The key that minted this one; None for a workspace's signup key.
    #: Revoking a key leaves the keys it minted live: list them with
    #: ``list_keys(created_by=...)``, or revoke them with it:
    #: ``revoke_key(id, include_minted=True)``.
    created_by_key_id: Optional[str]
    created_at: str
    revoked_at: Optional[str]


class RevokedApiKey(ApiKey, total=False):
    """revoke_key's answer: the revoked key and, with include_minted=True
    only, ``minted_revoked``: the ids (sorted) of the keys revoked with it,
    every live key minted from it down the tree (keys revoked before are
    left out; empty when none was live)."""
    minted_revoked: List[str]


class NewApiKey(ApiKey):
    """A key just minted, with its secret, shown only here."""
    secret: str


class ApiKeyPage(TypedDict):
    data: List[ApiKey]
    next_cursor: Optional[str]


# -- durable jobs ---------------------------------------------------------


class RetrySchedule(TypedDict):
    """A retry schedule: an endpoint's or a contract's."""
    preset: RetryPreset
    maxAttempts: int
    initialDelayMs: int
    multiplier: float
    maxDelayMs: int
    jitterPercent: float


class RetryPolicySnapshot(RetrySchedule):
    """The policy a job was enqueued with, its timeout included."""
    timeoutMs: int


class JobAttempt(TypedDict):
    """One execution of a job."""
    attempt: int
    workerId: str
    startedAt: str
    leaseExpiresAt: str
    reportedAt: Optional[str]
    outcome: Optional[JobOutcome]
    retryable: Optional[bool]
    retryAfterMs: Optional[int]
    errorMessage: Optional[str]
    errorMessageUnreadable: bool
    warning: Optional[str]


class JobAttemptPage(TypedDict):
    data: List[JobAttempt]
    nextCursor: Optional[str]


class JobReplay(TypedDict):
    """One replay of a job: who asked, why, and what it changed."""
    id: str
    keyId: str
    reason: Optional[str]
    priorStatus: Literal["EXHAUSTED", "CANCELLED"]
    priorAttempt: int
    additionalAttempts: int
    maxAttempts: int
    oldHandlerVersion: str
    newHandlerVersion: str
    oldContractVersion: Optional[int]
    newContractVersion: Optional[int]
    createdAt: str


class JobReplayPage(TypedDict):
    data: List[JobReplay]
    nextCursor: Optional[str]


class DurableJob(TypedDict):
    """A step's job: its status, lease, policy, last 50 executions and last
    50 replays (``attemptsTruncated``, ``replaysTruncated``)."""
    id: str
    status: JobStatus
    attempt: int
    maxAttempts: int
    dueAt: Optional[str]
    leaseExpiresAt: Optional[str]
    cancelRequested: bool
    policy: RetryPolicySnapshot
    policyVersion: int
    attempts: List[JobAttempt]
    attemptsTruncated: bool
    replays: List[JobReplay]
    replaysTruncated: bool


class Step(TypedDict):
    """A run's step with its job."""
    id: str
    runId: str
    name: str
    version: str
    endpoint: str
    status: JobStatus
    idempotencyKey: str
    contractVersion: Optional[int]
    afterStepId: Optional[str]
    afterStatus: Optional[AfterStatus]
    inputPreview: Any
    outputPreview: Any
    durableJob: DurableJob
    createdAt: str
    finishedAt: Optional[str]


class StepPage(TypedDict):
    data: List[Step]
    nextCursor: Optional[str]


class RunSummary(TypedDict):
    """A run without its steps (list_runs' items)."""
    id: str
    name: str
    status: RunStatus
    idempotencyKey: Optional[str]
    budgetMicros: Optional[int]
    spentMicros: Optional[int]
    completionRequested: bool
    synthetic: bool
    createdAt: str
    finishedAt: Optional[str]


class _RunFields(RunSummary):
    steps: List[Step]
    stepsTruncated: bool


class Run(_RunFields, total=False):
    """A run with its first steps (``stepsTruncated``: list_run_steps pages
    them all); ``deduplicated`` only in start_run's answer."""
    deduplicated: bool


class RunPage(TypedDict):
    data: List[RunSummary]
    nextCursor: Optional[str]


class EnqueueResult(TypedDict):
    """enqueue's answer (``deduplicated``: an identical enqueue's step)."""
    stepId: str
    jobId: str
    status: JobStatus
    idempotencyKey: str
    dueAt: Optional[str]
    deduplicated: bool


class ReplayUpgrade(TypedDict):
    """A contract version a replay could upgrade a step to, and whether its
    input still validates against it. ``checked`` is False when the preview
    did not check the input against it (its check budget ran out first, or
    ``inputUnreadable``): ``compatible`` is then False though it may fit,
    and a replay onto it checks it."""
    contractVersion: int
    handlerVersion: str
    status: ContractStatus
    forbidden: bool
    compatible: bool
    checked: bool
    validation: List[ValidationProblem]


class ReplayPreview(TypedDict):
    """replay_preview's answer."""
    stepId: str
    jobId: str
    name: str
    status: JobStatus
    attempt: int
    maxAttempts: int
    handlerVersion: str
    contractVersion: Optional[int]
    eligible: bool
    ineligibleReason: Optional[str]
    handlerVersionForbidden: bool
    endpointPaused: bool
    inputUnreadable: bool
    upgrades: List[ReplayUpgrade]


class ReplayResult(TypedDict):
    """replay's answer: the job queued again."""
    stepId: str
    jobId: str
    status: Literal["QUEUED"]
    attempt: int
    maxAttempts: int
    handlerVersion: str


class EndpointCircuit(TypedDict):
    """An endpoint's circuit breaker."""
    state: CircuitState
    consecutiveFailures: int
    openedAt: Optional[str]
    probeAt: Optional[str]


class Endpoint(TypedDict):
    """An endpoint and its policy (``retryPolicy`` None for a preset's)."""
    id: str
    name: str
    version: int
    policyPreset: RetryPreset
    retryPolicy: Optional[RetrySchedule]
    maxAttempts: int
    defaultTimeoutMs: int
    maxConcurrent: Optional[int]
    rateLimitPerMinute: Optional[int]
    circuitFailureThreshold: Optional[int]
    circuitCooldownMs: int
    paused: bool
    circuit: EndpointCircuit
    createdAt: str
    updatedAt: str


class EndpointPage(TypedDict):
    data: List[Endpoint]
    nextCursor: Optional[str]


class EndpointAttempt(JobAttempt):
    """An endpoint's attempt, with its job."""
    jobId: str
    stepId: str
    runId: str
    name: str
    version: str


class EndpointAttemptPage(TypedDict):
    data: List[EndpointAttempt]
    nextCursor: Optional[str]


class QueueHealth(TypedDict):
    """The queued work of one exact name@version."""
    name: str
    version: str
    queued: int
    due: int
    oldestQueuedAgeSeconds: int
    workersSeen: int
    pausedEndpoints: List[str]
    openCircuitEndpoints: List[str]
    atConcurrencyLimitEndpoints: List[str]
    rateLimitedEndpoints: List[str]
    message: Optional[str]


class QueueHealthPage(TypedDict):
    data: List[QueueHealth]
    nextCursor: Optional[str]


class Contract(TypedDict):
    """One contract version of a tool."""
    name: str
    contractVersion: int
    handlerVersion: str
    inputSchema: Any
    outputSchema: Any
    timeoutMs: int
    retryPreset: RetryPreset
    retryPolicy: Optional[RetrySchedule]
    status: ContractStatus
    createdAt: str


class ContractPage(TypedDict):
    data: List[Contract]
    nextCursor: Optional[str]


class ToolTest(TypedDict):
    """test_tool's answer: the synthetic job, in a run of its own."""
    runId: str
    stepId: str
    jobId: str
    name: str
    version: str
    contractVersion: Optional[int]
    status: JobStatus
    maxAttempts: int
    dueAt: Optional[str]


class _ReconcileItemFields(TypedDict):
    idempotency_key: str
    effect_id: Optional[str]
    ratchet_state: Optional[EffectState]
    vendor_status: Optional[VendorStatus]
    ratchet_amount_micros: Optional[int]
    vendor_amount_micros: Optional[int]


class ReconcileItem(_ReconcileItemFields, total=False):
    """One key compared (``outcome``: how a resolved one was resolved)."""
    outcome: ReportOutcome


class ReconcileCounts(TypedDict):
    matched: int
    missing_at_vendor: int
    unknown_to_ratchet: int
    amount_mismatch: int
    status_mismatch: int
    resolved: int
    unsettled: int


# Functional syntax: "from" is a Python keyword, which a class body cannot
# declare.
Reconciliation = TypedDict("Reconciliation", {
    "effect_type": str,
    "from": str,
    "to": str,
    "reconciled_at": str,
    "counts": ReconcileCounts,
    "matched": List[ReconcileItem],
    "missing_at_vendor": List[ReconcileItem],
    "unknown_to_ratchet": List[ReconcileItem],
    "amount_mismatch": List[ReconcileItem],
    "status_mismatch": List[ReconcileItem],
    "resolved": List[ReconcileItem],
    "unsettled": List[ReconcileItem],
})
Reconciliation.__doc__ = """reconcile's answer: the window compared, the counts and the lists."""


# -- the worker's routes --------------------------------------------------


class ClaimedJob(TypedDict):
    """A job claim leased: work it under its lease token."""
    jobId: str
    stepId: str
    runId: str
    name: str
    version: str
    attempt: int
    maxAttempts: int
    idempotencyKey: str
    input: Any
    leaseToken: str
    leaseExpiresAt: str
    leaseMs: int
    timeoutMs: int


class JobHeartbeat(TypedDict):
    """heartbeat_job's answer (stop working when cancelRequested)."""
    leaseExpiresAt: str
    cancelRequested: bool


class JobReportResult(TypedDict):
    """report_job's answer."""
    jobId: str
    status: JobStatus
    attempt: int
    nextDueAt: Optional[str]


class _BatchJobResultFields(TypedDict):
    jobId: str
    nextDueAt: Optional[str]
    error: Optional[RatchetError]


class BatchJobResult(_BatchJobResultFields, total=False):
    """One report's result in report_jobs' answer: ``error`` is None, or the
    RatchetError the single report would have raised (the SDK's, in place
    of the server's envelope), and then status and attempt are absent."""
    status: JobStatus
    attempt: int


__all__ = [
    "AfterStatus", "ApprovalReason", "ApprovalState", "AttemptOutcome", "BreakerAction", "CircuitOpenedBy",
    "CircuitState",
    "ContractStatus", "Decision", "DeliveryState", "DenialCode", "EffectState", "GroupState", "JobOutcome", "JobStatus",
    "OnIndeterminate", "PolicyMode", "ReportOutcome", "RetryPreset", "RunStatus", "Scope", "ThresholdFrom", "VendorStatus",
    "WebhookEventType",
    "ApiKey", "ApiKeyPage", "Approval", "ApprovalPage", "BatchJobResult", "BeginResponse", "Circuit",
    "CircuitPage", "ClaimedJob", "Compensation", "Contract", "ContractPage", "DimensionLimit", "DurableJob",
    "Effect", "EffectAttempt", "EffectHeartbeat", "EffectPage", "EffectPolicy", "EffectPolicyPage",
    "EmergencyStop", "Endpoint", "EndpointAttempt", "EndpointAttemptPage", "EndpointCircuit", "EndpointPage",
    "EnqueueResult", "ErrorBody", "Group", "GroupCommit", "GroupStep", "GroupStepPage", "JobAttempt",
    "JobAttemptPage", "JobHeartbeat", "JobReplay", "JobReplayPage", "JobReportResult", "NewApiKey", "NewWebhook",
    "PlanItem", "PriorAttempt", "QueueHealth", "QueueHealthPage", "ReconcileCounts", "ReconcileItem",
    "Reconciliation", "ReplayPreview", "ReplayResult", "ReplayUpgrade", "RetriedDeliveries", "RevokedApiKey",
    "RetryPolicySnapshot",
    "RetrySchedule", "Run", "RunPage", "RunSummary", "Step", "StepPage", "Structuring", "StructuringWindow",
    "ToolTest", "Unwind", "ValidationProblem", "Webhook", "WebhookDelivery", "WebhookDeliveryPage",
    "WebhookEvent", "WebhookPage",
]
