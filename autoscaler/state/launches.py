"""The rows of one gang launch: k `Instance` rows sharing the launch's request id.

The cycle commits them together (the intent), the provider gets one call for them
(`LaunchRequest(nodes=k, gang=...)`, the first row's request id as its idempotency
key), the sync and the launch outcome give each row a distinct instance of that call,
and the launch's join token may register each of those instances once. Everyone who
needs "the rest of this launch" asks here.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.state.models import Instance


def gang_rows(session: Session, launch_request_id: str) -> list[Instance]:
    """Every row of the gang launch, the first (whose own request id it is) first."""
    rows = list(
        session.scalars(
            select(Instance)
            .where(Instance.launch_request_id == launch_request_id)
            .order_by(Instance.created_at, Instance.id)
        )
    )
    rows.sort(key=lambda r: r.request_id != launch_request_id)
    return rows
