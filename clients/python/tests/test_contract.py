"""The SDK against docs/openapi.json, read when the tests run: every operation has a
method on both clients, every request field a parameter, every answer schema a model
with the same fields, every error kind an exception class. An operation added to the
API without a method fails here, naming it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from grove_client import AsyncClient, Client, errors, models
from grove_client._ops import ROUTES, TOOLS, UPCOMING
from grove_client.aio import AsyncTools
from grove_client.client import Tools

from .conftest import REPO_ROOT

DOC_PATH = Path(os.environ.get("GROVE_OPENAPI", REPO_ROOT / "docs" / "openapi.json"))
METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DOC_PATH.read_text())
    return data


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    name = ref.rsplit("/", 1)[-1]
    out: dict[str, Any] = doc["components"]["schemas"][name]
    return out


def method_of(cls: type[Any], name: str) -> Callable[..., Any] | None:
    if name.startswith("tools."):
        tools_cls = Tools if cls is Client else AsyncTools
        return getattr(tools_cls, name.split(".", 1)[1], None)
    return getattr(cls, name, None)


def parameters(fn: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(fn).parameters) - {"self"}


def test_every_operation_of_the_document_has_a_method_on_both_clients(
    doc: dict[str, Any],
) -> None:
    missing = []
    for method, path, op in operations(doc):
        names = ROUTES.get((method, path))
        if names is None:
            missing.append(f"{method} {path} ({op.get('operationId')}): no SDK method")
            continue
        for cls in (Client, AsyncClient):
            for name in names:
                if method_of(cls, name) is None:
                    missing.append(f"{method} {path}: {cls.__name__}.{name} is missing")
    assert not missing, "the SDK is behind docs/openapi.json:\n" + "\n".join(missing)


def test_every_route_of_the_sdk_is_in_the_document(doc: dict[str, Any]) -> None:
    documented = {(m, p) for m, p, _ in operations(doc)}
    ahead = sorted(f"{m} {p}: {UPCOMING[(m, p)]}" for m, p in UPCOMING if (m, p) not in documented)
    if ahead:
        print("SDK routes ahead of the document (UPCOMING):", *ahead, sep="\n  ")
    stale = sorted(
        f"{m} {p}" for m, p in ROUTES if (m, p) not in documented and (m, p) not in UPCOMING
    )
    assert not stale, f"SDK routes the document does not have: {stale}"


def test_every_request_field_query_and_header_is_a_parameter(doc: dict[str, Any]) -> None:
    problems = []
    for method, path, op in operations(doc):
        names = ROUTES.get((method, path), ())
        expected: set[str] = set()
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body is not None:
            schema = resolve(doc, body["schema"])
            expected |= set(schema.get("properties", {}))
        for p in op.get("parameters", []):
            if p["in"] == "query" and p["name"] != "follow":
                expected.add(p["name"])
            elif p["in"] == "header" and p["name"] == "X-Grove-Git-Token":
                expected.add("git_token")
        for cls in (Client, AsyncClient):
            for name in names:
                fn = method_of(cls, name)
                if fn is None:
                    continue
                params = parameters(fn)
                if name in ("call_tool",):
                    continue  # untyped by design: `args` is the body
                if name in ("iter_workspaces", "iter_events"):
                    params |= {"limit", "cursor"}  # paged by the iterator itself
                if name == "follow_events":
                    params |= {"limit"}  # a stream has no pages
                lacking = expected - params
                if lacking:
                    problems.append(
                        f"{cls.__name__}.{name} ({method} {path}) lacks {sorted(lacking)}"
                    )
    assert not problems, "\n".join(problems)


def test_every_tool_has_a_typed_method_whose_keywords_are_its_arguments(
    doc: dict[str, Any],
) -> None:
    schemas = doc["components"]["schemas"]
    documented = {n.split(".", 1)[1] for n in schemas if n.startswith("ToolArgs.")}
    assert documented == set(TOOLS), f"tools: document {sorted(documented)}, SDK {sorted(TOOLS)}"
    for name in documented:
        props = set(schemas[f"ToolArgs.{name}"].get("properties", {}))
        for cls in (Tools, AsyncTools):
            params = parameters(getattr(cls, name)) - {"workspace_id", "git_token"}
            assert params == props, f"{cls.__name__}.{name}: {sorted(params)} != {sorted(props)}"


def answer_schemas(doc: dict[str, Any]) -> set[str]:
    """Every schema an operation answers with (success or error), and those it nests."""
    found: set[str] = set()

    def walk(schema: Any) -> None:
        if isinstance(schema, dict):
            ref = schema.get("$ref")
            if ref is not None:
                name = ref.rsplit("/", 1)[-1]
                if name not in found:
                    found.add(name)
                    walk(doc["components"]["schemas"][name])
            for v in schema.values():
                walk(v)
        elif isinstance(schema, list):
            for v in schema:
                walk(v)

    for _, _, op in operations(doc):
        for response in op.get("responses", {}).values():
            walk(response.get("content", {}))
    return found


def compare_model(
    doc: dict[str, Any],
    schema: dict[str, Any],
    cls: type[Any],
    where: str,
    problems: list[str],
    tag: str | None = None,
) -> None:
    """`cls` against an object schema: the same fields, required ones without a
    default, and inline objects of arrays (a tool's entries) against the item class."""
    schema = resolve(doc, schema)
    props = dict(schema.get("properties", {}))
    required = set(schema.get("required", []))
    if tag is not None:
        tag_schema = props.pop("output", {})
        if tag_schema.get("enum") != [tag]:
            problems.append(f"{where}: tagged {tag_schema.get('enum')}, the SDK expects {tag!r}")
        required.discard("output")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if set(fields) != set(props):
        problems.append(
            f"{where}: {cls.__name__} lacks {sorted(set(props) - set(fields))}, "
            f"has undocumented {sorted(set(fields) - set(props))}"
        )
    hints = typing.get_type_hints(cls)
    for name in sorted(required & set(fields)):
        f = fields[name]
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if not no_default and name != "paths":  # `paths`: absent when empty, by design
            problems.append(f"{where}.{name} is required but has a default")
    for name, prop in props.items():
        items = prop.get("items", {}) if prop.get("type") == "array" else {}
        if name in fields and "properties" in items:
            (item_cls,) = typing.get_args(hints[name])
            compare_model(doc, items, item_cls, f"{where}.{name}[]", problems)


def test_every_tool_output_schema_is_its_model(doc: dict[str, Any]) -> None:
    tags = {cls: tag for tag, cls in models.TOOL_OUTPUTS.items()}
    problems: list[str] = []
    for tool, (_, cls) in sorted(TOOLS.items()):
        op = doc["paths"].get(f"/v1/workspaces/{{id}}/tools/{tool}", {}).get("post", {})
        answer = op.get("responses", {}).get("200", {}).get("content", {})
        schema = answer.get("application/json", {}).get("schema")
        if schema is None or "$ref" not in schema:
            problems.append(f"{tool}: the document does not type its answer")
            continue
        compare_model(doc, schema, cls, schema["$ref"].rsplit("/", 1)[-1], problems, tags[cls])
    assert not problems, "\n".join(problems)


def test_every_answer_schema_has_a_model_with_its_fields(doc: dict[str, Any]) -> None:
    schemas = doc["components"]["schemas"]
    problems: list[str] = []
    for name in sorted(answer_schemas(doc)):
        schema = schemas[name]
        if "properties" not in schema or name.startswith("ToolOutput."):
            continue  # enums, unions (ExecEvent), and tool outputs (the test above)
        model = models.SCHEMA_MODELS.get(name)
        if model is None:
            problems.append(f"{name}: no model")
            continue
        compare_model(doc, schema, model, name, problems)
    assert not problems, "\n".join(problems)


def test_every_error_kind_has_its_exception_class(doc: dict[str, Any]) -> None:
    kinds = doc["components"]["schemas"]["ErrorKind"]["enum"]
    assert set(kinds) == set(errors.ERROR_CLASSES), (
        f"kinds {sorted(kinds)} vs classes {sorted(errors.ERROR_CLASSES)}"
    )
    for kind, cls in errors.ERROR_CLASSES.items():
        assert issubclass(cls, errors.ApiError) and cls.kind_name == kind


def test_the_sync_and_async_clients_offer_the_same_methods() -> None:
    def public(cls: type[Any]) -> dict[str, set[str]]:
        return {
            n: parameters(f)
            for n, f in inspect.getmembers(cls, callable)
            if not n.startswith("_") and n not in ("close", "aclose")
        }

    assert public(Client) == public(AsyncClient)
    assert public(Tools) == public(AsyncTools)
    for name, fn in inspect.getmembers(AsyncClient, inspect.isfunction):
        if name.startswith("_") or name in ("aclose",):
            continue
        assert inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn), name
