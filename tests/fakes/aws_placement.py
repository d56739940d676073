"""EC2 placement groups for the moto middleware (moto 5 has none), modelled on EC2's API.

What it models, because the driver depends on it:

- `CreatePlacementGroup` (GroupName, Strategy, TagSpecification) answers
  `InvalidPlacementGroup.Duplicate` for a name that exists;
- `DescribePlacementGroups` by `GroupName.N` or `Filter.N` (`group-name`, `strategy`,
  `state`, `tag:<key>`), an unknown name is `InvalidPlacementGroup.Unknown`;
- `DeletePlacementGroup` refuses a group that still holds an instance that is not
  terminated (`InvalidPlacementGroup.InUse`), and an unknown one (`...Unknown`);
- `RunInstances` into `Placement.GroupName` needs the group to exist; a cluster group
  takes one zone only (the first launch's), another is `InvalidParameterCombination`.
  Membership is read from moto's answer (the instance ids it started).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
ACTIONS = ("CreatePlacementGroup", "DescribePlacementGroups", "DeletePlacementGroup")


class PlacementError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Group:
    name: str
    strategy: str
    group_id: str
    tags: dict[str, str] = field(default_factory=dict)
    zone: str | None = None
    members: set[str] = field(default_factory=set)


@dataclass
class PlacementGroups:
    """The groups of one account and region. `alive(instance_id)` asks moto whether an
    instance is not yet terminated."""

    alive: Callable[[str], bool]
    groups: dict[str, Group] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _next: int = 1

    def handle(self, action: str, params: dict[str, str]) -> bytes:
        with self.lock:
            if action == "CreatePlacementGroup":
                return self._create(params)
            if action == "DescribePlacementGroups":
                return self._describe(params)
            return self._delete(params)

    def check_launch(self, params: dict[str, str], zone: str | None) -> str | None:
        """Before RunInstances: the group it names, or raise as EC2 would."""
        name = params.get("Placement.GroupName")
        if not name:
            return None
        with self.lock:
            group = self.groups.get(name)
            if group is None:
                raise PlacementError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
            if group.strategy == "cluster" and group.zone and zone and group.zone != zone:
                raise PlacementError(
                    "InvalidParameterCombination",
                    f"placement group {name} is in {group.zone}; a cluster group spans one zone",
                )
        return name

    def joined(self, name: str, zone: str | None, instance_ids: list[str]) -> None:
        with self.lock:
            group = self.groups[name]
            group.zone = group.zone or zone
            group.members.update(instance_ids)

    def _create(self, params: dict[str, str]) -> bytes:
        name = params.get("GroupName", "")
        if not name:
            raise PlacementError("MissingParameter", "GroupName is required")
        if name in self.groups:
            raise PlacementError("InvalidPlacementGroup.Duplicate", f"The Placement Group '{name}' already exists.")
        tags: dict[str, str] = {}
        for key, value in params.items():
            m = re.fullmatch(r"TagSpecification\.(\d+)\.Tag\.(\d+)\.Key", key)
            if m and params.get(f"TagSpecification.{m.group(1)}.ResourceType") == "placement-group":
                tags[value] = params.get(f"TagSpecification.{m.group(1)}.Tag.{m.group(2)}.Value", "")
        group = Group(name, params.get("Strategy", "cluster"), f"pg-{self._next:017x}", tags)
        self._next += 1
        self.groups[name] = group
        return _xml("CreatePlacementGroup", f"<return>true</return><placementGroup>{_fields(group)}</placementGroup>")

    def _describe(self, params: dict[str, str]) -> bytes:
        names = [v for k, v in params.items() if re.fullmatch(r"GroupName\.\d+", k)]
        for name in names:
            if name not in self.groups:
                raise PlacementError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        chosen = [self.groups[n] for n in names] if names else list(self.groups.values())
        filters: list[tuple[str, set[str]]] = []
        for key, fname in params.items():
            m = re.fullmatch(r"Filter\.(\d+)\.Name", key)
            if m:
                values = {v for k, v in params.items() if re.fullmatch(rf"Filter\.{m.group(1)}\.Value\.\d+", k)}
                filters.append((fname, values))
        kept = [g for g in chosen if all(_matches(g, f, v) for f, v in filters)]
        return _xml(
            "DescribePlacementGroups", "<placementGroupSet>" + "".join(_item(g) for g in kept) + "</placementGroupSet>"
        )

    def _delete(self, params: dict[str, str]) -> bytes:
        name = params.get("GroupName", "")
        group = self.groups.get(name)
        if group is None:
            raise PlacementError("InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown.")
        if any(self.alive(i) for i in group.members):
            raise PlacementError("InvalidPlacementGroup.InUse", f"There are instances in placement group {name}")
        del self.groups[name]
        return _xml("DeletePlacementGroup", "<return>true</return>")


def _matches(group: Group, name: str, values: set[str]) -> bool:
    if name.startswith("tag:"):
        return group.tags.get(name[4:]) in values
    attr = {"group-name": group.name, "strategy": group.strategy, "state": "available"}.get(name)
    return attr in values


def _fields(group: Group) -> str:
    tags = "".join(f"<item><key>{escape(k)}</key><value>{escape(v)}</value></item>" for k, v in group.tags.items())
    return (
        f"<groupName>{escape(group.name)}</groupName><groupId>{group.group_id}</groupId>"
        f"<strategy>{escape(group.strategy)}</strategy><state>available</state><tagSet>{tags}</tagSet>"
    )


def _item(group: Group) -> str:
    return f"<item>{_fields(group)}</item>"


def _xml(action: str, inner: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{action}Response xmlns="{NS}">'
        f"<requestId>placement-fake</requestId>{inner}</{action}Response>"
    ).encode()
