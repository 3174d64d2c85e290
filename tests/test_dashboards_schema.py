"""The committed dashboard JSON is current and validates against Grafana's and kvscope's schemas."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from kvscope.dashboards.generate import JSON_DIR, rendered
from kvscope.dashboards.model import Json
from tests.dashboards_support import DASHBOARDS, GRAFANA_PANEL_SCHEMAS, GRAFANA_SCHEMA, SCHEMA

Spoil = Callable[[Json], object]  # breaks a copy of a dashboard in one place


# --- generated files, schema, names -------------------------------------------------------------
def test_committed_json_is_current() -> None:
    """Regenerate and compare: `python -m kvscope.dashboards.generate` after editing."""
    committed = {p.name: p.read_text(encoding="utf-8") for p in JSON_DIR.glob("*.json")}
    expected = rendered()
    assert sorted(committed) == sorted(expected), "run python -m kvscope.dashboards.generate"
    for name, content in expected.items():
        assert committed[name] == content, f"{name} is stale: python -m kvscope.dashboards.generate"


def _errors(schema: Json, instance: Any, definition: str | None = None, at: str = "") -> list[str]:
    """Every validation error, as `path: message` (the path after `at`), in the schema's own
    draft (the generated ones are draft-07). `definition`: validate against that definition
    instead of the root. An error of an `anyOf` (a panel is a Panel or a RowPanel) is told by
    those of its branches."""
    if definition is not None:
        schema = {**schema, "$ref": f"#/definitions/{definition}"}
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)

    def leaves(errors: Iterable[jsonschema.ValidationError]) -> Iterator[str]:
        for e in errors:
            if e.context:
                yield from leaves(e.context)
            else:
                path = "/".join(str(x) for x in [at, *e.absolute_path] if x != "")
                yield f"{path}: {e.message}"

    return list(leaves(validator(schema).iter_errors(instance)))


def grafana_errors(dashboard: Json) -> list[str]:
    """Errors against Grafana's dashboard schema, then each panel's options and custom field
    config against its plugin's schema (Grafana's dashboard schema leaves both open)."""
    errors = _errors(GRAFANA_SCHEMA, dashboard)
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            continue
        where = f"panels/{p.get('id')} ({p.get('type')})"
        plugin = GRAFANA_PANEL_SCHEMAS.get(p.get("type"))
        if plugin is None:
            errors.append(
                f"{where}: no schema for this panel type: add it to "
                "scripts/grafana-schema.sh and run it"
            )
            continue
        errors += _errors(plugin, p.get("options"), "Options", f"{where}/options")
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is None:
            continue
        if "FieldConfig" not in plugin["definitions"]:
            errors.append(f"{where}: custom field config, but the plugin has none")
            continue
        errors += _errors(plugin, custom, "FieldConfig", f"{where}/fieldConfig/defaults/custom")
    return errors


@pytest.mark.parametrize("path", sorted(JSON_DIR.glob("*.json")), ids=lambda p: p.name)
def test_json_validates_against_grafanas_schema(path: Path) -> None:
    """Grafana's dashboard model, and every panel's options against its plugin's."""
    dashboard = json.loads(path.read_text())
    assert grafana_errors(dashboard) == []


def test_grafanas_schema_fails_a_broken_dashboard() -> None:
    good = json.loads(json.dumps(DASHBOARDS[0]))
    assert grafana_errors(good) == []
    panel = next(i for i, p in enumerate(good["panels"]) if p["type"] == "timeseries")
    spoils: list[tuple[Spoil, str]] = [
        (lambda d: d["panels"][panel].update(gridPos="0 0 12 8"), "gridPos: '0 0 12 8' is not"),
        (lambda d: d["panels"][panel]["gridPos"].pop("w"), "gridPos: 'w' is a required"),
        (lambda d: d["panels"][panel].update(titel="typo"), "'titel' was unexpected"),
        (lambda d: d.update(refresh=30), "refresh: 30 is not of type 'string'"),
        (lambda d: d["templating"]["list"][0].update(type="dropdown"), "'dropdown' is not one"),
        (lambda d: d["annotations"]["list"][1]["target"].pop("limit"), "'limit' is a required"),
        (lambda d: d.pop("schemaVersion"), "'schemaVersion' is a required"),
        # What only the panel plugins' schemas know:
        (
            lambda d: d["panels"][panel]["options"]["legend"].update(placement="top"),
            "options/legend/placement: 'top' is not one of",
        ),
        (lambda d: d["panels"][panel]["options"].pop("tooltip"), "'tooltip' is a required"),
        (
            lambda d: d["panels"][panel]["fieldConfig"]["defaults"]["custom"].update(
                drawStyle="dots"
            ),
            "custom/drawStyle: 'dots' is not one of",
        ),
        (lambda d: d["panels"][panel].update(type="radar"), "no schema for this panel type"),
    ]
    for spoil, expected in spoils:
        bad = json.loads(json.dumps(good))
        spoil(bad)
        errors = grafana_errors(bad)
        assert any(expected in e for e in errors), (expected, errors)


@pytest.mark.parametrize("path", sorted(JSON_DIR.glob("*.json")), ids=lambda p: p.name)
def test_json_validates_against_the_dashboard_schema(path: Path) -> None:
    """kvscope's own, stricter schema (see test_the_schema_is_strict for what it adds)."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    dashboard = json.loads(path.read_text())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(dashboard)
    ]
    assert errors == []
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert len(set(names)) == len(names)


def test_the_schema_is_strict() -> None:
    """kvscope's schema fails what Grafana's lets through: it is kept for those."""
    validator = jsonschema.Draft202012Validator(SCHEMA)
    good = json.loads(json.dumps(DASHBOARDS[0]))
    assert validator.is_valid(good)
    spoils: list[tuple[Spoil, bool]] = [
        (lambda d: d["panels"][1].update(titel="typo"), True),
        (lambda d: d["templating"]["list"][0].update(type="dropdown"), True),
        (lambda d: d.pop("schemaVersion"), True),
        # Grafana's schema leaves these open (targets, annotation targets, variables) or
        # loses them in its TypeScript (the grid's bounds):
        (lambda d: d["panels"][1]["targets"][0].update(exprr="up"), False),
        (lambda d: d["panels"][1]["targets"][0].pop("expr"), False),
        (lambda d: d["panels"][1]["gridPos"].update(w=25), False),
        (lambda d: d["annotations"]["list"][1]["target"].pop("rawSql"), False),
        (lambda d: d["templating"]["list"][1].update(qurey="up"), False),
        (lambda d: d.pop("uid"), False),
    ]
    for spoil, grafana_sees_it in spoils:
        bad = json.loads(json.dumps(good))
        spoil(bad)
        assert not validator.is_valid(bad)
        assert bool(grafana_errors(bad)) == grafana_sees_it


_PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
}
