"""The structured-output fields of a completions or chat request -> one StructuredOutputsParams.

Accepted as vLLM's OpenAI server accepts them, on both endpoints:
  response_format      {"type": "text"} (nothing), {"type": "json_object"}, or {"type": "json_schema",
                       "json_schema": {"name", "schema", "strict", "description"}}
  structured_outputs   {json, regex, choice, grammar, json_object, disable_any_whitespace,
                       disable_additional_properties, whitespace_pattern, disable_fallback}
  guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern (vLLM's older
                       names), guided_decoding_backend ("guidance", "llguidance" or "auto": llguidance
                       is the one backend here)
As in vLLM, response_format's constraint joins the options given in structured_outputs; more than
one constraint in all is a 400. The spec is compiled (without the tokenizer) here, so a bad schema,
regex, choice list or grammar is a 400 naming the request field it came from.
"""

from __future__ import annotations

from typing import Any

from mla_export.runtime.structured_output import BACKENDS, StructuredOutputError, StructuredOutputsParams, grammar_of

from .api_error import bad_request

__all__ = ["parse_structured_outputs", "STRUCTURED_FIELDS"]

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern", "disable_fallback")
_SO_FIELDS = ("json", "regex", "choice", "grammar", "json_object", *_OPTIONS)
STRUCTURED_FIELDS = ("response_format", "structured_outputs", *_GUIDED, "guided_whitespace_pattern",
                     "guided_decoding_backend")


def _type_name(v: Any) -> str:
    return "null" if v is None else {bool: "boolean", int: "integer", float: "number", str: "string", list: "array",
                                     dict: "object"}.get(type(v), type(v).__name__)


def _collect(body: dict) -> tuple[dict[str, Any], dict[str, str]]:
    """(StructuredOutputsParams fields the request gives, field -> the request field it came from)."""
    fields: dict[str, Any] = {}  # StructuredOutputsParams field -> value
    source: dict[str, str] = {}  # StructuredOutputsParams field -> the request field it came from

    def put(name: str, value: Any, param: str) -> None:
        fields[name] = value
        source[name] = param

    so = body.get("structured_outputs")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_request(f"'structured_outputs' must be an object, got {_type_name(so)}", "structured_outputs")
        for k, v in so.items():
            if k == "structural_tag" and v is not None:
                raise bad_request("'structured_outputs.structural_tag': structural tags are not supported by this "
                                  "server", "structured_outputs.structural_tag")
            if k not in _SO_FIELDS:
                raise bad_request(f"'structured_outputs.{k}' is not a structured-outputs field (known: "
                                  f"{', '.join(_SO_FIELDS)})", f"structured_outputs.{k}")
            if v is not None:
                put(k, v, f"structured_outputs.{k}")
    for name, kind in _GUIDED.items():
        v = body.get(name)
        if v is not None:
            if kind in fields:
                raise bad_request(f"'{name}' and '{source[kind]}' both give the constraint; give one", name)
            put(kind, v, name)
    if body.get("guided_whitespace_pattern") is not None:
        put("whitespace_pattern", body["guided_whitespace_pattern"], "guided_whitespace_pattern")
    backend = body.get("guided_decoding_backend")
    if backend is not None and (not isinstance(backend, str) or backend.split(":")[0] not in BACKENDS):
        raise bad_request(f"'guided_decoding_backend' {backend!r} is not available: this server's structured outputs "
                          f"run on llguidance ({', '.join(repr(b) for b in BACKENDS)})", "guided_decoding_backend")

    rf = body.get("response_format")
    if rf is not None:
        if not isinstance(rf, dict):
            raise bad_request(f"'response_format' must be an object, got {_type_name(rf)}", "response_format")
        kind = rf.get("type")
        if kind == "json_object":
            put("json_object", True, "response_format")
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise bad_request("'response_format.json_schema' must be an object with 'name' and 'schema'",
                                  "response_format.json_schema")
            name = js.get("name")
            if name is not None and not isinstance(name, str):
                raise bad_request("'response_format.json_schema.name' must be a string",
                                  "response_format.json_schema.name")
            if js.get("strict") is not None and not isinstance(js.get("strict"), bool):
                raise bad_request("'response_format.json_schema.strict' must be a boolean",
                                  "response_format.json_schema.strict")
            schema = js.get("schema")
            if not isinstance(schema, dict):
                raise bad_request(f"'response_format.json_schema.schema' must be a JSON schema object, got "
                                  f"{_type_name(schema)}", "response_format.json_schema.schema")
            put("json", schema, "response_format.json_schema.schema")
        elif kind != "text":
            raise bad_request(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                              "response_format.type")
    return fields, source


def _constraints(fields: dict[str, Any]) -> list[str]:
    return [k for k in ("json", "regex", "choice", "grammar", "json_object") if fields.get(k) not in (None, False)]


def parse_structured_outputs(body: dict) -> StructuredOutputsParams | None:
    """The request's constraint (None when it has none); a 400 naming the field otherwise."""
    fields, source = _collect(body)
    kinds = _constraints(fields)
    if not kinds:  # options alone (or json_object false) constrain nothing, as in vLLM
        return None
    if len(kinds) > 1:
        raise bad_request("give one structured-output constraint, got "
                          + " and ".join(f"'{source[k]}'" for k in kinds), source[kinds[1]])
    try:
        params = StructuredOutputsParams(**fields)
        grammar_of(params)  # the spec compiles: a bad one is a 400 now, not an error mid-generation
    except StructuredOutputError as e:
        param = source.get(e.field, "structured_outputs")
        raise bad_request(f"'{param}': {e.reason}", param) from None
    except ValueError as e:
        raise bad_request(str(e), source[kinds[0]]) from None
    return params


def tool_choice_constraint(body: dict, schema: dict, schema_param: str, what: str) -> StructuredOutputsParams:
    """The constraint of a forcing tool_choice (`what`: its description): the tools' JSON schema
    with the request's structured-output options (disable_any_whitespace, ...), as vLLM joins
    them. A constraint of the request's own cannot join it: a 400 naming its field (vLLM lets
    the tool's schema replace it silently). A schema llguidance cannot use is a 400 naming
    `schema_param`."""
    fields, source = _collect(body)
    kinds = _constraints(fields)
    if kinds:
        param = source[kinds[0]]
        raise bad_request(f"'{param}' cannot be combined with 'tool_choice' {what}: the tool call's schema is "
                          "the output's constraint", param)
    fields = {k: v for k, v in fields.items() if k not in ("json_object",)}
    try:
        params = StructuredOutputsParams(**fields, json=schema)
        grammar_of(params)
    except StructuredOutputError as e:
        param = schema_param if e.field == "json" else source.get(e.field, "structured_outputs")
        raise bad_request(f"'{param}': {e.reason}", param) from None
    except ValueError as e:
        raise bad_request(str(e), schema_param) from None
    return params
