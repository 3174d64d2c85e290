"""A fleet's settings (collector/fleet.py) from the config file's `[fleet]` and from flags.

[fleet]                                  # --bind, --topic-pattern, --replay-template, ...
bind = "tcp://0.0.0.0:5557"
topic_pattern = 'kv@(?P<ip>[^@]+):(?P<port>\\d+)@(?P<model>.+)'
replica_format = "{ip}:{port}"
replay_template = "tcp://{ip}:5558"
gone_after_s = 60.0
dp_ranks = 1                             # binds bind's port .. + dp_ranks - 1
max_publishers = 4096
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from kvscope.collector.fleet import FleetError, FleetSettings, TopicPattern

_TEXT = ("bind", "topic_pattern", "replica_format", "replay_template")


BindOpt = Annotated[
    str | None,
    typer.Option(
        "--bind",
        envvar="KVSCOPE_BIND",
        help="Bind this address (tcp://0.0.0.0:5557) for a fleet: every vLLM publisher that "
        "connects to it is followed, told apart by its topic. Default: [fleet] bind.",
    ),
]
TopicPatternOpt = Annotated[
    str | None,
    typer.Option(
        envvar="KVSCOPE_TOPIC_PATTERN",
        help="A fleet topic's regex, with named groups (default: llm-d's kv@<ip>:<port>@<model>).",
    ),
]
ReplicaFormatOpt = Annotated[
    str | None,
    typer.Option(
        envvar="KVSCOPE_REPLICA_FORMAT",
        help="A fleet replica's name from the topic's groups (default: {ip}:{port}).",
    ),
]
ReplayTemplateOpt = Annotated[
    str | None,
    typer.Option(
        envvar="KVSCOPE_REPLAY_TEMPLATE",
        help="A fleet publisher's replay endpoint from the topic's groups, e.g. "
        "tcp://{ip}:5558 (default: none, gaps are not replayed).",
    ),
]
GoneAfterOpt = Annotated[
    float | None,
    typer.Option(
        envvar="KVSCOPE_GONE_AFTER",
        min=0.0,
        help="Seconds of silence after which a fleet publisher is shown as gone (default: 60).",
    ),
]


def fleet_section(section: Any) -> FleetSettings:
    """`[fleet]` of the config file, checked (a pattern that cannot work is refused here)."""
    if not isinstance(section, dict):
        raise FleetError("[fleet] must be a table")
    unknown = set(section) - {f.name for f in dataclasses.fields(FleetSettings)}
    if unknown:
        raise FleetError(f"[fleet]: unknown keys {sorted(unknown)}")
    if "bind" not in section:
        raise FleetError('[fleet] needs bind, e.g. bind = "tcp://0.0.0.0:5557"')
    for key, value in section.items():
        if key in _TEXT:
            valid, expected = isinstance(value, str) and value != "", "a non-empty string"
        elif key in ("max_publishers", "dp_ranks"):
            valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            expected = "a count >= 1"
        else:
            valid = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            expected = "a number of seconds > 0"
        if not valid:
            raise FleetError(f"[fleet] {key} has value {value!r}, not {expected}")
    return checked(FleetSettings(**section))


def checked(settings: FleetSettings) -> FleetSettings:
    TopicPattern(settings)
    if not settings.bind.startswith(("tcp://", "ipc://", "inproc://")):
        raise FleetError(f"fleet bind {settings.bind!r}: expected tcp://HOST:PORT")
    return settings


def fleet_with_flags(
    file: FleetSettings | None,
    bind: str | None,
    topic_pattern: str | None,
    replica_format: str | None,
    replay_template: str | None,
    gone_after_s: float | None,
) -> FleetSettings | None:
    """The file's fleet with each flag given on top; a fleet flag without a bind is refused."""
    flags = {
        "--topic-pattern": topic_pattern,
        "--replica-format": replica_format,
        "--replay-template": replay_template,
        "--gone-after": gone_after_s,
    }
    if file is None and bind is None:
        given = [name for name, value in flags.items() if value is not None]
        if given:
            raise FleetError(f"{', '.join(given)} needs --bind (or [fleet] bind in the file)")
        return None
    base = file if file is not None else FleetSettings(bind=str(bind))
    return checked(
        FleetSettings(
            bind=base.bind if bind is None else bind,
            topic_pattern=base.topic_pattern if topic_pattern is None else topic_pattern,
            replica_format=base.replica_format if replica_format is None else replica_format,
            replay_template=base.replay_template if replay_template is None else replay_template,
            gone_after_s=base.gone_after_s if gone_after_s is None else gone_after_s,
            dp_ranks=base.dp_ranks,
            max_publishers=base.max_publishers,
        )
    )
