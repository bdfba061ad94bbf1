"""Errors in OpenAI's JSON shape: ``{"error": {"message", "type", "param", "code"}}``.

Every failure a client can cause maps to one status: a malformed body or a bad parameter
400 (naming the field), a missing or wrong API key 401, an unknown model or route 404, a
full queue 429. FastAPI's own 422 for validation errors is replaced by a 400 so that the
official ``openai`` client raises ``BadRequestError`` as it would against OpenAI.
"""

from __future__ import annotations

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
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        on_error(400)
        return _validation_error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        on_error(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        on_error(500)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
