"""getratchet: the Python client of the Ratchet API (standard library only).

Produce durable jobs (start_run, enqueue, finish_run), work them
(register_tool, worker.start), wrap an agent's side effects in the effect
gate (do_effect, do_effect_async for asyncio code, blind_key), and verify
webhook deliveries (verify_webhook). Answers are plain dicts typed by the
TypedDicts of getratchet.types (Effect, Run, Step, ...), their enumerated
fields by its Literal aliases (EffectState, GroupState, ...), exported here
too.
"""

from . import types
from ._http import VERSION as __version__
from .client import AFTER_FAILED, AFTER_SUCCEEDED, EffectOutcome, Lease, Ratchet, blind_key, create_ratchet
from .errors import (ApprovalRequired, ConnectionLost, EffectBlocked, EffectDenied, EffectInFlight,
                     InvalidDecisionError, LeaseLost, NoWebhookSecretError, NonRetryableError, NotPerformed,
                     OutcomeNotReported, RatchetError, ReportNotRecorded, ResultNotStored, RetryableError,
                     WebhookSignatureError)
from .redact import redact_message
from .types import (AfterStatus, ApiKey, ApiKeyPage, Approval, ApprovalPage, ApprovalReason, ApprovalState,
                    AttemptOutcome,
                    BatchJobResult, BeginResponse, BreakerAction, Circuit, CircuitOpenedBy, CircuitPage, CircuitState,
                    ClaimedJob, Compensation, Contract, ContractPage, ContractStatus, Decision, DeliveryState,
                    DenialCode,
                    DimensionLimit, DurableJob, Effect, EffectAttempt, EffectHeartbeat, EffectPage, EffectPolicy,
                    EffectPolicyPage, EffectState, EmergencyStop, Endpoint, EndpointAttempt, EndpointAttemptPage,
                    EndpointCircuit, EndpointPage, EnqueueResult, ErrorBody, Group, GroupCommit, GroupState, GroupStep,
                    GroupStepPage, JobAttempt, JobAttemptPage, JobHeartbeat, JobReplay, JobReplayPage, JobReportResult,
                    JobOutcome, JobStatus,
                    NewApiKey, NewWebhook, OnIndeterminate, PlanItem, PolicyMode, PriorAttempt, QueueHealth,
                    QueueHealthPage, ReconcileCounts, ReconcileItem, Reconciliation, ReplayPreview, ReplayResult,
                    ReplayUpgrade, ReportOutcome, RetriedDeliveries, RetryPreset, RevokedApiKey,
                    RetryPolicySnapshot, RetrySchedule, Run, RunPage,
                    RunStatus, RunSummary, Scope, Step, StepPage, Structuring, StructuringWindow, ThresholdFrom,
                    ToolTest, Unwind,
                    ValidationProblem, VendorStatus, Webhook, WebhookDelivery, WebhookDeliveryPage, WebhookEvent,
                    WebhookEventType, WebhookPage)
from .webhooks import verify_webhook
from .worker import JobContext, Worker

__all__ = [
    "__version__", "AFTER_FAILED", "AFTER_SUCCEEDED", "ApprovalRequired", "ConnectionLost", "EffectBlocked",
    "EffectDenied", "EffectInFlight", "EffectOutcome", "InvalidDecisionError", "JobContext", "Lease", "LeaseLost",
    "NoWebhookSecretError", "NonRetryableError", "NotPerformed", "OutcomeNotReported", "Ratchet", "RatchetError",
    "ReportNotRecorded", "ResultNotStored", "RetryableError", "WebhookSignatureError", "Worker", "blind_key",
    "create_ratchet", "redact_message", "verify_webhook",
]
# The answers' TypedDicts and Literal aliases (getratchet.types), plain dicts
# and strings at run time. Listed by name, as types.__all__ lists them:
# mypy reads only a literal list as re-exports (not `+= types.__all__`), so
# under --strict (no implicit re-export) `from getratchet import Effect`
# failed.
__all__ += [
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
