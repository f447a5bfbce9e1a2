"""OpenAI's ``response_format`` and the grammar fields of the three endpoints, as grammars.

``response_format`` is ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}`` (any
JSON object) or ``{"type": "json_schema", "json_schema": {"name", "schema", "strict",
"description"}}``. ``/generate`` and both OpenAI endpoints also take SGLang's fields
``json_schema`` (a schema, as an object or a string), ``regex``, ``ebnf`` and vLLM's
``choice`` (a list of strings). ``grammar_of`` turns what a request set into the engine's
``(kind, text)``, checked: a second constraint, or one the grammar library refuses, is a
400 naming the field.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Literal, Tuple

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

from minisgl.structured import GrammarError, check_grammar


class ConstraintError(ValueError):
    """An output constraint the server refuses; ``field`` names the request's field."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: StrictStr = Field(max_length=64)
    schema_: Dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: StrictBool | None = None  # always strict here: the grammar is the schema
    description: StrictStr | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def as_grammar(field: str, value: Any) -> Tuple[str, str] | None:
    """The ``(kind, text)`` of one request field's value (None: the field asks for nothing).

    Raises:
        ConstraintError: naming ``field``, when the value is malformed.
    """
    if value is None:
        return None
    if field == "response_format":
        if value.type == "text":
            return None
        if value.type == "json_object":
            return ("json_object", "")
        if value.json_schema is None:
            raise ConstraintError("a json_schema response_format needs its json_schema", field)
        return ("json_schema", json.dumps(value.json_schema.schema_))
    if field == "json_schema":
        return ("json_schema", value if isinstance(value, str) else json.dumps(value))
    if field == "choice":
        return ("choice", json.dumps(value))
    return (field, value)  # regex, ebnf: the text itself


def grammar_of(fields: Dict[str, Any]) -> Tuple[str, str] | None:
    """The one grammar the request's constraint ``fields`` (name -> value) ask for, checked.

    Raises:
        ConstraintError: naming the field, for two constraints at once or an invalid one.
    """
    asked: List[Tuple[str, Tuple[str, str]]] = [
        (name, g) for name, v in fields.items() if (g := as_grammar(name, v)) is not None
    ]
    if not asked:
        return None
    if len(asked) > 1:
        names = " and ".join(name for name, _ in asked)
        raise ConstraintError(
            f"at most one output constraint per request, got {names}", asked[1][0]
        )
    name, grammar = asked[0]
    try:
        check_grammar(*grammar)
    except GrammarError as e:
        raise ConstraintError(str(e), name) from None
    return grammar
