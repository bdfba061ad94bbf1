"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can cause maps to one status: a malformed body or a bad parameter
400 (naming the field), a missing or wrong API key 401, an unknown model or route 404, a
full queue 429. FastAPI's own 422 for validation errors is replaced by a 400 so that the
official ``openai`` client raises ``BadRequestError`` as it would against OpenAI.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class APIError(Exception):
    """An error a handler returns to the client with ``status`` and OpenAI's fields."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(status: int, message: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {
        "message": message,
        "type": _ERROR_TYPES.get(status, "invalid_request_error"),
        "param": param,
        "code": code,
    }}


def error_response(status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status)


#: Python refuses to parse integers longer than this (``sys.get_int_max_str_digits``: a
#: quadratic conversion); every integer field of the API fits in 64 bits (19 digits).
MAX_INTEGER_DIGITS = sys.get_int_max_str_digits() or 4300
_BODY_PARSE_FAILED = "There was an error parsing the body"


class _HugeInteger:
    """An integer literal longer than ``MAX_INTEGER_DIGITS``, kept as its digit count."""

    def __init__(self, num_digits: int) -> None:
        self.num_digits = num_digits


def _parse_int(literal: str) -> int | _HugeInteger:
    num_digits = len(literal.lstrip("-"))
    return _HugeInteger(num_digits) if num_digits > MAX_INTEGER_DIGITS else int(literal)


def _find_huge_integer(value: Any, path: tuple[str, ...] = ()) -> tuple[str, _HugeInteger] | None:
    """The dotted path (``messages.0.content``, as validation errors name fields) of the
    first huge integer in ``value``, depth first."""
    if isinstance(value, _HugeInteger):
        return ".".join(path), value
    children = (value.items() if isinstance(value, dict)
                else enumerate(value) if isinstance(value, list) else ())
    for key, child in children:
        found = _find_huge_integer(child, (*path, str(key)))
        if found is not None:
            return found
    return None


def describe_unparseable_body(body: bytes) -> tuple[str, str | None]:
    """Why a body FastAPI could not parse (it says only "error parsing the body") was
    refused, and the field it concerns: an integer beyond Python's digit limit, bytes that
    are not UTF-8, nesting deeper than the parser's recursion limit."""
    try:
        parsed = json.loads(body, parse_int=_parse_int)
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8: byte {exc.start} is {body[exc.start:exc.start + 1]!r}", None
    except RecursionError:
        return "the body nests arrays or objects too deeply to parse (at most a few hundred levels)", None
    except ValueError as exc:
        return f"malformed JSON body: {exc}", None
    found = _find_huge_integer(parsed)
    if found is None:
        return "the body could not be parsed as JSON", None
    path, huge = found
    name = path or "the body"
    return (f"{name} is an integer of {huge.num_digits} digits; a request's integers may "
            f"have at most {MAX_INTEGER_DIGITS} digits, and every integer field of this API "
            "fits in 64 bits (at most 19 digits)", path or None)


def _validation_error_response(exc: RequestValidationError) -> JSONResponse:
    """The first validation error as a 400: the field's dotted path and what was wrong."""
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        where = f" at character {loc[0]}" if loc else ""
        detail = first.get("ctx", {}).get("error", first.get("msg", ""))
        return error_response(400, f"malformed JSON body{where}: {detail}", None, "invalid_json")
    # Union types add the member type to the location (prompt.str, prompt.list[int]...);
    # the client named the field, so keep the path up to the first type name.
    type_names = ("str", "int", "float", "bool")
    fields = [part for part in loc if "[" not in part and part not in type_names]
    param = ".".join(fields) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if first.get("type") == "missing":
        message = f"{param} is required" if param else "a required field is missing"
    if first.get("type") == "extra_forbidden":
        message = (f"{param} is not supported by this server (the README lists the accepted "
                   "fields)")
    return error_response(400, message, param, first.get("type"))


def install_error_handlers(app: FastAPI, on_error: Callable[[int], None]) -> None:
    """Register handlers that turn every failure into OpenAI's shape; ``on_error(status)``
    is called once per error response (the metrics count them)."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        on_error(exc.status)
        message = exc.message
        if exc.param and exc.param.split(".")[0] not in message:  # every 400 names its field
            message = f"{exc.param}: {message}"
        return error_response(exc.status, message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        on_error(400)
        return _validation_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        on_error(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        param = None
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 400 and message == _BODY_PARSE_FAILED:
            # NOTE: the route read the body into this same Request object (cached)
            message, param = describe_unparseable_body(await request.body())
        return error_response(exc.status_code, message, param)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        on_error(500)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
