"""`/openapi.json`: the shapes the gateway really accepts and answers, for clients and
fuzzers. The completion endpoints are fast routes (gateway/http/asgi_app.py) that read their body
themselves, so their request and response bodies are described here, from the same limits
the parser enforces (gateway/pipeline/parse.py owns the checks; these models only document them)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field, create_model

from gateway.config.guards import RequestLimits


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # engines take more fields than these


class Message(_Open):
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Open):
    include_usage: bool | None = None


def _common_fields(limits: RequestLimits) -> dict[str, Any]:
    return {
        "model": (str, Field(min_length=1)),
        "stream": (bool | None, None),
        "stream_options": (StreamOptions | None, None),
        "max_tokens": (int | None, Field(default=None, ge=1, le=limits.max_max_tokens)),
        "max_completion_tokens": (int | None, Field(default=None, ge=1, le=limits.max_max_tokens)),
        "temperature": (float | None, None),
        "top_p": (float | None, None),
        "user": (str | None, Field(default=None, max_length=limits.max_session_key_chars)),
        "prompt_cache_key": (
            str | None,
            Field(default=None, max_length=limits.max_session_key_chars),
        ),
        "cache_salt": (str | None, None),
    }


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Choice(_Open):
    index: int
    finish_reason: str | None = None


class Completion(_Open):
    id: str
    object: str
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


def _request_models(limits: RequestLimits) -> tuple[type[BaseModel], type[BaseModel]]:
    common = _common_fields(limits)
    chat = create_model(
        "ChatCompletionRequest",
        __base__=_Open,
        messages=(list[Message], Field(min_length=1, max_length=limits.max_messages)),
        tools=(list[dict[str, Any]] | None, None),
        **common,
    )
    prompt_type = str | list[str] | list[int]
    completion = create_model(
        "CompletionRequest",
        __base__=_Open,
        prompt=(prompt_type, Field()),
        **common,
    )
    return chat, completion


def _responses_model(limits: RequestLimits) -> type[BaseModel]:
    """`POST /v1/responses`' body (gateway/http/responses_api.py refuses any other field)."""
    key = Field(default=None, max_length=limits.max_session_key_chars)
    return create_model(
        "ResponsesRequest",
        __config__=ConfigDict(extra="forbid"),
        model=(str, Field(min_length=1)),
        input=(str | list[InputItem], Field()),
        instructions=(str | None, None),
        previous_response_id=(str | None, None),
        store=(bool | None, None),
        stream=(bool | None, None),
        max_output_tokens=(int | None, Field(default=None, ge=1, le=limits.max_max_tokens)),
        temperature=(float | None, None),
        top_p=(float | None, None),
        user=(str | None, key),
        prompt_cache_key=(str | None, key),
        metadata=(dict[str, str] | None, None),
        text=(dict[str, Any] | None, None),
    )


class InputItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class ResponseObject(_Open):
    id: str
    object: str
    created_at: int
    status: str
    model: str
    output: list[dict[str, Any]]
    previous_response_id: str | None = None
    usage: dict[str, Any] | None = None


_ERRORS = {
    str(code): {
        "description": why,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for code, why in (
        (400, "invalid request (the field is named in `param`)"),
        (401, "missing or unknown API key"),
        (404, "model not served"),
        (408, "request body too slow"),
        (413, "request body too large"),
        (429, "rate limited (Retry-After, x-ratelimit-*)"),
        (502, "every instance failed"),
        (503, "no healthy instance (Retry-After)"),
    )
}


_SESSION_HEADER = {"name": "x-session-id", "in": "header", "schema": {"type": "string"}}


def _operation(
    summary: str, request_ref: str, answer_ref: str = "#/components/schemas/Completion"
) -> dict[str, Any]:
    return {
        "summary": summary,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": request_ref}}},
        },
        "parameters": [
            {
                "name": "x-session-id",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
            }
        ],
        "responses": {
            "200": {
                "description": "the answer (JSON), or an SSE stream when `stream` is true",
                "content": {
                    "application/json": {"schema": {"$ref": answer_ref}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **_ERRORS,
        },
    }


def install_openapi(app: FastAPI, limits: RequestLimits) -> None:
    """Serve `/openapi.json` with the completion endpoints and the admin API described."""
    chat, completion = _request_models(limits)
    responses = _responses_model(limits)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version="1", routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (chat, completion, responses, Completion, ResponseObject, ErrorBody):
            for name, sub in model.model_json_schema(ref_template=_REF).get("$defs", {}).items():
                components[name] = sub
            body = model.model_json_schema(ref_template=_REF)
            body.pop("$defs", None)
            components[model.__name__] = body
        paths = schema.setdefault("paths", {})
        paths["/v1/chat/completions"] = {
            "post": _operation("Chat completion", f"#/components/schemas/{chat.__name__}")
        }
        paths["/v1/completions"] = {
            "post": _operation("Completion", f"#/components/schemas/{completion.__name__}")
        }
        paths["/v1/responses"] = {
            "post": _operation(
                "Response (OpenAI's Responses API, served as a chat completion)",
                f"#/components/schemas/{responses.__name__}",
                "#/components/schemas/ResponseObject",
            )
        }
        explain = paths.get("/admin/route/explain", {})
        if "post" in explain:
            explain["post"]["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "oneOf": [
                                {"$ref": f"#/components/schemas/{chat.__name__}"},
                                {"$ref": f"#/components/schemas/{completion.__name__}"},
                            ]
                        }
                    }
                },
            }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


_REF = "#/components/schemas/{model}"
