"""`GET /api/v1/pools` shows each pool's scale-down settings as the config has them,
and a config with an unknown warm-pool rule is refused with the field and the choices."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.api.app import create_app
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.errors import ConfigError
from tests.conftest import issue_token, make_context


def test_pools_show_their_idle_timeout_and_warm_pool(config: AutoscalerConfig, sessions: sessionmaker[Session]) -> None:
    first = config.pools[0].model_copy(update={"warm_pool": "fixed", "idle_timeout_s": 90.0})
    cfg = config.model_copy(update={"pools": [first, *config.pools[1:]]})
    ctx = make_context(cfg, sessions)
    headers = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    pools = {p["name"]: p for p in TestClient(create_app(ctx)).get("/api/v1/pools", headers=headers).json()}
    assert (pools[first.name]["warm_pool"], pools[first.name]["idle_timeout_s"]) == ("fixed", 90.0)
    assert all(pools[p.name]["warm_pool"] == "adaptive" for p in config.pools[1:])


def test_an_unknown_warm_pool_rule_is_refused_with_the_choices() -> None:
    text = "pools:\n  - {name: p, provider: fake, warm_pool: sometimes}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, Path("bad.yaml"))
    assert "pools.0.warm_pool" in str(err.value) and "'adaptive' or 'fixed'" in str(err.value)
