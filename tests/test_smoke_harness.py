from sqlalchemy import text


def test_both_backends_are_migrated(sessions) -> None:
    with sessions() as s:
        assert s.execute(text("SELECT count(*) FROM tasks")).scalar() == 0
