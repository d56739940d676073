"""A static (on-prem) pool's settings: the machines it declares in `options.machines`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from providers.base import DriverOptions, parse_options


class StaticMachine(DriverOptions):
    name: str = Field(min_length=1)
    gpus: int = Field(0, ge=0)
    gpu_type: str | None = None


class StaticOptions(DriverOptions):
    # Each machine as a name, or {name, gpus, gpu_type}; machines may also simply
    # register with the pool's join token without being declared.
    machines: tuple[StaticMachine, ...] = ()

    @field_validator("machines", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            return [{"name": m} if isinstance(m, str) else m for m in value]
        return value

    @field_validator("machines")
    @classmethod
    def _unique(cls, value: tuple[StaticMachine, ...]) -> tuple[StaticMachine, ...]:
        names = [m.name for m in value]
        if len(set(names)) != len(names):
            raise ValueError(f"machine names must be unique: {names}")
        return value


class StaticSettings(StaticOptions):
    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> StaticSettings:
        return cls(**parse_options(StaticOptions, "static", options).model_dump())
