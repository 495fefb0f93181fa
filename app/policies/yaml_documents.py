"""An SLA policy's spec as a YAML document, for keeping policies in Git (GitOps).

The document is the spec itself (``teams``, ``services``), after a comment header naming
the policy and its version; comments are for people and are dropped on import. Import
validates exactly as the JSON API does and names a refused field the same way
(``spec.teams[0].guaranteed_gpus``), adding the line it is on; a document that is not
YAML at all is refused naming the line and column where parsing stopped.

Anchors and aliases are refused: the export never writes them, and an alias repeats a
node without repeating its text, so a few kilobytes could otherwise stand for a million
fields to validate (and as many errors to report).
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from app.core.errors import Invalid
from app.policies.models import SlaPolicy, SlaPolicySpec, spec_field

MEDIA_TYPE = "application/yaml"
# What clients send for YAML besides the registered type (RFC 9512).
YAML_MEDIA_TYPES = (MEDIA_TYPE, "application/x-yaml", "text/yaml", "text/x-yaml")


# PyYAML's pure-Python loader reads about 0.5 MB/s (the C one is not used: it recurses on
# the C stack, where a deeply nested document crashes the process). A spec at its bounds
# (1,000 teams, 1,000 services, every field written) is under 300 kB.
MAX_DOCUMENT_BYTES = 1024 * 1024
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# Errors listed in a refusal: a document with thousands of wrong keys needs the first few
# to be fixed, not an answer the size of the document; the rest are counted.
MAX_ERRORS_LISTED = 20


class _AnchorRefused(Exception):
    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__()
        self.line = mark.line + 1
        self.column = mark.column + 1


class _SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that leaves unquoted timestamps as text: pydantic reads them as
    the JSON API does, and refuses an impossible date naming its field and line rather
    than the loader failing on it with no position. Refuses anchors and aliases (the
    module's docstring says why) before composing the node that has one."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        alias = self.check_event(yaml.AliasEvent)
        event = self.current_event  # the node's first event, which check_event parsed
        if alias or getattr(event, "anchor", None) is not None:
            raise _AnchorRefused(event.start_mark)
        return super().compose_node(parent, index)


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != TIMESTAMP_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class _PlainDumper(yaml.SafeDumper):
    """Never writes anchors and aliases: a file people edit should say each value where
    it applies."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def export_document(policy: SlaPolicy) -> str:
    when = policy.created_at.isoformat(timespec="seconds")
    header = (
        f"# SLA policy {policy.name}, version {policy.version}"
        f"{' (deleted; its last terms)' if policy.deleted else ''}\n"
        f"# written {when} by {policy.created_by}\n"
        f"# Import: POST /api/v1/policies/{policy.name}/import "
        f"(Content-Type: {MEDIA_TYPE}); the same terms write no new version.\n"
    )
    body = yaml.dump(
        policy.spec, Dumper=_PlainDumper, sort_keys=False, allow_unicode=True, width=100
    )
    return header + body


def parse_document(raw: bytes) -> SlaPolicySpec:
    """The spec a YAML document states, validated; ``Invalid`` naming the field or line."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise Invalid(
            f"body: a YAML document over {MAX_DOCUMENT_BYTES} bytes; a spec is far smaller",
            field="body",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Invalid(f"body: not UTF-8 (byte {exc.start})", field="body") from None
    loader = _SpecLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except _AnchorRefused as exc:
        raise Invalid(
            f"body: an anchor or alias (&name, *name) at line {exc.line}, column "
            f"{exc.column}; write each value where it applies, as the export does",
            field="body",
            details={"line": exc.line, "column": exc.column},
        ) from None
    except yaml.YAMLError as exc:
        raise _syntax_error(exc) from None
    except RecursionError:
        raise Invalid("body: nested too deeply for an SLA policy spec", field="body") from None
    except (ValueError, TypeError, OverflowError) as exc:
        # An explicit tag's value its constructor cannot take (!!timestamp 2026-13-45).
        raise Invalid(f"body: a value YAML cannot construct: {exc}", field="body") from None
    finally:
        loader.dispose()
    if root is None or data is None:
        raise Invalid("spec: the document is empty; state teams and services", field="spec")
    if not isinstance(data, dict):
        raise Invalid(
            f"spec: the document is a {type(data).__name__}, not a mapping of teams and "
            "services (line 1)",
            field="spec",
            details={"line": root.start_mark.line + 1},
        )
    try:
        return SlaPolicySpec.model_validate(data)
    except ValidationError as exc:
        raise _field_error(exc, root) from None


def _syntax_error(exc: yaml.YAMLError) -> Invalid:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return Invalid(f"body: not YAML: {problem}", field="body")
    line, column = mark.line + 1, mark.column + 1
    return Invalid(
        f"body: not YAML at line {line}, column {column}: {problem}",
        field="body",
        details={"line": line, "column": column},
    )


def _field_error(exc: ValidationError, root: yaml.Node) -> Invalid:
    lines = _Lines(root)
    errors: list[dict[str, Any]] = []
    for error in exc.errors()[:MAX_ERRORS_LISTED]:
        loc = list(error["loc"])
        errors.append(
            {
                "field": spec_field(loc),
                "message": error["msg"],
                "type": error["type"],
                "line": lines.of(loc),
            }
        )
    first = errors[0]
    message = f"{first['field']}: {first['message']} (line {first['line']})"
    details: dict[str, Any] = {"errors": errors, "line": first["line"]}
    more = exc.error_count() - len(errors)
    if more:
        message += f"; {more} more errors after the {len(errors)} in details.errors"
        details["more_errors"] = more
    return Invalid(message, field=first["field"], details=details)


class _Lines:
    """Where a field is in the document. A mapping's keys are indexed once, on the first
    look into it: scanning them for each error would be quadratic in a mapping with
    thousands of wrong keys."""

    def __init__(self, root: yaml.Node) -> None:
        self.root = root
        self.keys: dict[int, dict[Any, yaml.Node]] = {}

    def _child(self, mapping: yaml.MappingNode, key: int | str) -> yaml.Node | None:
        index = self.keys.get(id(mapping))
        if index is None:
            # The last of a repeated key, as the loader keeps; a non-scalar key is no field.
            index = {k.value: v for k, v in mapping.value if isinstance(k, yaml.ScalarNode)}
            self.keys[id(mapping)] = index
        return index.get(key)

    def of(self, loc: list[int | str]) -> int:
        """The line (1-based) of the deepest node of ``loc`` the document has: the value at
        fault, or the entry it is missing from."""
        node = self.root
        for part in loc:
            child: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode):
                child = self._child(node, part)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                child = node.value[part] if 0 <= part < len(node.value) else None
            if child is None:
                break
            node = child
        return int(node.start_mark.line) + 1
