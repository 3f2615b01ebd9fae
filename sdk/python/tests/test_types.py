"""The answers' TypedDicts (getratchet.types) against the server's own
OpenAPI document, as served: each client method's return type has exactly
the fields its route's response schema has (a field the server adds or
drops, or one misspelled here, fails), the same ones always present, each
of the JSON type its schema names (str, int, float, bool, a list, an
object), and Optional exactly where the schema allows null. A field (or a
list's items) whose schema has an enum is typed Literal[...] with exactly
its values, and a Literal only where the schema has an enum. Nested
TypedDicts are compared with the schemas of the fields holding them."""

import json
import typing
import unittest
import urllib.request
from typing import Any, Dict, List, Optional, Tuple, TypedDict

import getratchet
from getratchet import types
from support import BASE_URL, require_server

# Each client method whose answer is a TypedDict (or a list of them), by the
# operationId of the route it calls: its success answer's schema, or
# (operationId, status) for another status's body (a denied begin is
# answered 403 with the begin's fields and its error), or (operationId,
# None, field) for a list the method answers from a field of the body.
# Several sources merge: every field of each, present always only where
# present in all.
METHODS: Dict[str, List[Tuple[Any, ...]]] = {
    "start_run": [("runs.create",)], "enqueue": [("runs.enqueue",)], "finish_run": [("runs.finish",)],
    "get_run": [("runs.get",)], "get_step": [("steps.get",)], "list_step_attempts": [("steps.attempts",)],
    "list_step_replays": [("steps.replays",)], "list_runs": [("runs.list",)], "list_run_steps": [("runs.steps",)],
    "cancel_step": [("steps.cancel",)], "replay_preview": [("steps.replay.preview",)], "replay": [("steps.replay",)],
    "begin": [("effects.begin",), ("effects.begin", "403")], "report_effect": [("effects.report",)],
    "heartbeat_effect": [("effects.heartbeat",)], "get_effect": [("effects.get",)],
    "resolve_effect": [("effects.resolve",)], "list_effects": [("effects.list",)],
    "claim": [("workers.claim", None, "jobs")], "heartbeat_job": [("jobs.heartbeat",)],
    "report_job": [("jobs.report",)], "report_jobs": [("jobs.report.batch", None, "results")],
    "list_effect_policies": [("policies.list",)], "get_effect_policy": [("policies.get",)],
    "get_policy_structuring": [("policies.structuring",)], "update_effect_policy": [("policies.put",)],
    "list_approvals": [("approvals.list",)], "get_approval": [("approvals.get",)],
    "approve": [("approvals.approve",)], "reject": [("approvals.reject",)], "list_circuits": [("circuits.list",)],
    "open_circuit": [("circuits.open",)], "close_circuit": [("circuits.close",)],
    "emergency_stop": [("circuits.stop",)], "get_emergency_stop": [("circuits.stop.get",)],
    "release_emergency_stop": [("circuits.release",)], "create_group": [("groups.create",)],
    "get_group": [("groups.get",)], "list_group_steps": [("groups.steps",)], "commit_group": [("groups.commit",)],
    "unwind_group": [("groups.unwind",)], "create_webhook": [("webhooks.create",)],
    "list_webhooks": [("webhooks.list",)], "get_webhook": [("webhooks.get",)],
    "delete_webhook": [("webhooks.delete",)], "update_webhook": [("webhooks.update",)],
    "list_webhook_deliveries": [("webhooks.deliveries",)],
    "retry_webhook_deliveries": [("webhooks.deliveries.retry",)],
    "rotate_webhook_secret": [("webhooks.rotate_secret",)], "create_key": [("keys.create",)],
    "list_keys": [("keys.list",)], "current_key": [("keys.current",)], "revoke_key": [("keys.revoke",)],
    "list_endpoints": [("endpoints.list",)], "create_endpoint": [("endpoints.create",)],
    "get_endpoint": [("endpoints.policy.get",)], "update_endpoint_policy": [("endpoints.policy.put",)],
    "pause_endpoint": [("endpoints.pause",)], "resume_endpoint": [("endpoints.resume",)],
    "close_endpoint_circuit": [("endpoints.circuit.close",)],
    "list_endpoint_attempts": [("endpoints.attempts",)], "publish_contract": [("contracts.publish",)],
    "list_contracts": [("contracts.list",)], "test_tool": [("tools.test",)], "reconcile": [("reconcile",)],
    "list_queue_health": [("queue.health",)],
}

# Fields whose value is the SDK's, not the wire's: report_jobs answers each
# report's error as the RatchetError (or None) the single report would
# raise, always present, in place of the server's envelope.
SDK_FIELDS = {("BatchJobResult", "error")}


def is_typeddict(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, dict) and hasattr(t, "__required_keys__")


def unwrap_optional(t: Any) -> Tuple[Any, bool]:
    """(T, True) for Optional[T], (t, False) otherwise."""
    if typing.get_origin(t) is typing.Union:
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) < len(typing.get_args(t)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True
    return t, False


def schema_any(s: Any) -> bool:
    """Whether a schema allows any JSON value (raw JSON: true, or {})."""
    return s is True or (isinstance(s, dict) and not ({"type", "anyOf", "oneOf", "properties", "$ref"} & set(s)))


def allows_null(s: Any) -> bool:
    kinds = s.get("type") if isinstance(s, dict) else None
    return kinds == "null" or (isinstance(kinds, list) and "null" in kinds)


def kind_matches(t: Any, s: Dict[str, Any]) -> bool:
    """Whether a field's type (without Optional) is the JSON type its
    schema names: str, int, float, bool, a list, a TypedDict or dict."""
    kinds = s.get("type")
    kinds = [k for k in (kinds if isinstance(kinds, list) else [kinds]) if k != "null"]
    if len(kinds) != 1:
        return True  # several types, or none named: nothing to compare
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return kinds[0] == "string" and all(isinstance(v, str) for v in typing.get_args(t))
    return {"string": t is str, "integer": t is int, "number": t is float, "boolean": t is bool,
            "array": origin is list, "object": is_typeddict(t) or origin is dict}.get(kinds[0], True)


def enum_drift(t: Any, s: Any, where: str) -> List[str]:
    """How a field's type (without Optional) differs from its schema's
    enum: a Literal of exactly the enum's values (null aside) where the
    schema has one, none where it has not; a list's items likewise."""
    s = s if isinstance(s, dict) else {}
    if typing.get_origin(t) is list:
        return enum_drift(typing.get_args(t)[0], s.get("items", {}), where + "[]")
    literal = typing.get_origin(t) is typing.Literal
    if "enum" not in s:
        return [f"{where}: typed {t}, the schema has no enum"] if literal else []
    enum = sorted(v for v in s["enum"] if v is not None)
    if not literal:
        return [f"{where}: typed {t}, the schema's enum is {enum}: a Literal"]
    declared = sorted(typing.get_args(t))
    if declared != enum:
        return [f"{where}: Literal{declared}, the schema's enum is {enum}"]
    return []


def compare(annotation: Any, schema: Any, where: str, problems: List[str], seen: Dict[str, Any]) -> None:
    """Appends how annotation (a TypedDict, or a list or str-keyed dict of
    them, at any depth) differs from schema; records each TypedDict met."""
    t, _ = unwrap_optional(annotation)
    origin = typing.get_origin(t)
    if origin is list:
        compare(typing.get_args(t)[0], schema.get("items", {}) if isinstance(schema, dict) else {},
                where + "[]", problems, seen)
        return
    if origin is dict:
        extra = schema.get("additionalProperties", {}) if isinstance(schema, dict) else {}
        compare(typing.get_args(t)[1], extra, where + "{}", problems, seen)
        return
    if not is_typeddict(t):
        return
    seen.setdefault(t.__name__, t)
    props: Dict[str, Any] = schema.get("properties", {}) if isinstance(schema, dict) else {}
    hints = typing.get_type_hints(t)
    name = f"{where} ({t.__name__})"
    missing, extra = sorted(set(props) - set(hints)), sorted(set(hints) - set(props))
    if missing:
        problems.append(f"{name} lacks {missing}")
    if extra:
        problems.append(f"{name} has fields the server does not send: {extra}")
    sdk = {field for owner, field in SDK_FIELDS if owner == t.__name__}
    both = set(props) & set(hints) - sdk
    always = set(schema.get("required", [])) & both
    declared = set(t.__required_keys__) & both
    if always - declared:
        problems.append(f"{name}: always present per the schema but declared total=False: "
                        f"{sorted(always - declared)}")
    if declared - always:
        problems.append(f"{name}: may be absent per the schema but declared required: {sorted(declared - always)}")
    for field in sorted(both):
        field_type, optional = unwrap_optional(hints[field])
        if schema_any(props[field]):
            if hints[field] is not Any:
                problems.append(f"{name}.{field}: any JSON value per the schema, typed {hints[field]}")
            continue
        if optional != allows_null(props[field]):
            problems.append(f"{name}.{field}: Optional is {optional} but the schema's null is "
                            f"{allows_null(props[field])}")
        if not kind_matches(field_type, props[field]):
            problems.append(f"{name}.{field}: typed {field_type} but the schema's type is {props[field].get('type')}")
        problems.extend(enum_drift(field_type, props[field], f"{name}.{field}"))
        compare(field_type, props[field], f"{where}.{field}", problems, seen)


def operation_schemas(doc: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Each operationId's responses."""
    out = {}
    for ops in doc["paths"].values():
        for op in ops.values():
            out[op["operationId"]] = op["responses"]
    return out


def body_schema(responses: Dict[str, Any], status: Optional[str]) -> Any:
    """The JSON schema of status's body (the first 2xx's when None), the
    route's own where it is one of several (anyOf with the Error envelope)."""
    statuses = [status] if status else sorted(s for s in responses if s.startswith("2"))
    for st in statuses:
        content = responses.get(st, {}).get("content", {}).get("application/json")
        if content:
            schema = content["schema"]
            for alternative in schema.get("anyOf", []):
                if "$ref" not in alternative:
                    return alternative
            return schema
    raise AssertionError(f"no JSON body among {statuses}")


def merged(schemas: List[Any]) -> Dict[str, Any]:
    """Several object schemas as one: every property of each (the first's
    schema for a shared one), required only where all require it."""
    props: Dict[str, Any] = {}
    for s in schemas:
        for k, v in s.get("properties", {}).items():
            props.setdefault(k, v)
    required = set.intersection(*(set(s.get("required", [])) for s in schemas))
    return {"type": "object", "properties": props, "required": sorted(required)}


def method_schema(ops: Dict[str, Dict[str, Any]], sources: List[Tuple[Any, ...]]) -> Any:
    schemas = []
    for source in sources:
        op, status, field = (tuple(source) + (None, None))[:3]
        schema = body_schema(ops[op], status)
        schemas.append(schema["properties"][field] if field else schema)
    return schemas[0] if len(schemas) == 1 else merged(schemas)


def drift(doc: Dict[str, Any]) -> Tuple[List[str], Dict[str, Any]]:
    """Every difference between the client's answer types and doc, and the
    TypedDicts compared."""
    ops = operation_schemas(doc)
    problems: List[str] = []
    seen: Dict[str, Any] = {}
    for method, sources in sorted(METHODS.items()):
        answer = typing.get_type_hints(getattr(getratchet.Ratchet, method))["return"]
        compare(answer, method_schema(ops, sources), method, problems, seen)
    event = typing.get_type_hints(getratchet.verify_webhook)["return"]
    compare(event, doc["components"]["schemas"]["WebhookEvent"], "verify_webhook", problems, seen)
    return problems, seen


def literals() -> Dict[str, Any]:
    """The module's Literal aliases (EffectState...), by name."""
    return {name: getattr(types, name) for name in types.__all__
            if typing.get_origin(getattr(types, name)) is typing.Literal}


def typeddicts() -> Dict[str, Any]:
    return {name: getattr(types, name) for name in types.__all__ if is_typeddict(getattr(types, name))}


def literal_args(t: Any) -> List[Any]:
    """The Literals within a type (Optional[List[EffectState]]...)."""
    if typing.get_origin(t) is typing.Literal:
        return [t]
    return [lit for a in typing.get_args(t) for lit in literal_args(a)]


def answers_typeddict(annotation: Any) -> bool:
    t, _ = unwrap_optional(annotation)
    if typing.get_origin(t) in (list, dict):
        return any(answers_typeddict(a) for a in typing.get_args(t))
    return is_typeddict(t)


class TypesAgainstOpenAPITest(unittest.TestCase):
    def test_answer_types_match_the_served_openapi_document(self) -> None:
        require_server(self)
        with urllib.request.urlopen(BASE_URL + "/api/v1/openapi.json", timeout=30) as response:
            doc = json.loads(response.read())
        problems, seen = drift(doc)
        if problems:
            self.fail("the answer types differ from the served OpenAPI document:\n" + "\n".join(problems))
        # Every TypedDict of the module was compared, and every method that
        # answers one is mapped to its route.
        self.assertEqual(sorted(seen), sorted(typeddicts()))
        answering = {name for name, fn in vars(getratchet.Ratchet).items() if callable(fn)
                     and not name.startswith("_") and answers_typeddict(typing.get_type_hints(fn).get("return"))}
        self.assertEqual(sorted(answering), sorted(METHODS))
        # Every Literal alias of the module types some answer's field.
        used = {repr(a) for t in seen.values() for h in typing.get_type_hints(t).values() for a in literal_args(h)}
        unused = sorted(name for name, alias in literals().items() if repr(alias) not in used)
        self.assertEqual(unused, [], "Literal aliases no answer field uses")

    def test_the_comparison_catches_drift(self) -> None:
        # A field missing, one the server does not send, one declared
        # always present that may be absent, a nullable one not Optional, a
        # nested one missing: each is reported.
        class Inner(TypedDict):
            a: int

        class Outer(TypedDict):
            id: int
            note: str
            extra: int
            inner: Inner
            items: List[Inner]
            state: str
            mode: Optional[typing.Literal["on", "off"]]
            tags: List[typing.Literal["a"]]
            plain: typing.Literal["x"]

        enum = {"type": "string", "enum": ["on", "off", "auto"]}
        schema = {"type": "object", "required": ["id", "inner", "items", "state", "mode", "tags", "plain"],
                  "properties": {
            "id": {"type": "string"}, "note": {"type": ["null", "string"]}, "gone": {"type": "integer"},
            "inner": {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}},
            "items": {"type": "array", "items": {"type": "object", "required": ["a", "b"],
                                                  "properties": {"a": {"type": "integer"}, "b": {}}}},
            "state": enum, "mode": {"type": ["null", "string"], "enum": ["on", "off", "auto", None]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, "plain": {"type": "string"}}}
        problems: List[str] = []
        compare(Outer, schema, "x", problems, {})
        text = "\n".join(problems)
        for expected in ("x (Outer) lacks ['gone']", "server does not send: ['extra']", "declared required: ['note']",
                         "x (Outer).note: Optional is False", "x.items[] (Inner) lacks ['b']",
                         "x (Outer).id: typed <class 'int'> but the schema's type is string",
                         "x (Outer).state: typed <class 'str'>, the schema's enum is ['auto', 'off', 'on']: a Literal",
                         "x (Outer).mode: Literal['off', 'on'], the schema's enum is ['auto', 'off', 'on']",
                         "x (Outer).tags[]: Literal['a'], the schema's enum is ['a', 'b']",
                         "x (Outer).plain: typed typing.Literal['x'], the schema has no enum"):
            self.assertIn(expected, text)
        self.assertEqual(len(problems), 10, text)
        problems = []
        compare(Inner, {"type": "object", "required": ["a"], "properties": {"a": {"type": "integer"}}}, "y",
                problems, {})
        self.assertEqual(problems, [])


if __name__ == "__main__":
    unittest.main()
