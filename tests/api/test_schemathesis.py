"""A bounded schemathesis run against the OpenAPI document: no 500, no response off its schema.

The app runs in process over a SQLite file, authenticated as an admin of every team with an API
token. Operations that would end the fuzzer's own credentials are left out (logout, password
change, token revocation, disabling users); their behaviour has tests of its own.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import SECRET
from treadle.api.app import create_app
from treadle.api.settings import ApiSettings
from treadle.domain.access import ALL_TEAMS, Role
from treadle.engine import accounts
from treadle.engine.accounts import Caller
from treadle.engine.dags import sync_dags
from treadle.store import leases
from treadle.store.database import Database, db_now

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
#: Operations whose success would take the fuzzer's own token or account away.
SELF_ENDING = r"^/api/v1/(auth/(logout|password)|tokens/\{[^}]+\}(/revoke)?|users/\{[^}]+\}/disable)$"
TOKEN: dict[str, str] = {}
#: Examples generated per operation: the whole run stays well under a minute on a busy machine.
MAX_EXAMPLES = 15


@pytest.fixture(scope="module")
def fuzzed_app(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Any) -> Iterator[Any]:
    """The API over a migrated SQLite file with the test DAGs and an admin token."""
    import shutil

    from tests.api.dags_for_api import fin_broken, fin_report, ops_daily

    path = tmp_path_factory.mktemp("fuzz") / "treadle.db"
    shutil.copy(sqlite_template, path)
    db = Database(f"sqlite:///{path}")
    sync_dags(
        db,
        structures=[d.structure() for d in (fin_report, fin_broken, ops_daily)],
        scanned_files=[],
        errors={},
    )
    by = Caller(actor="test")
    accounts.create_team(db, "finance", by=by)
    accounts.create_user(db, "fuzzer", "a long fuzzing password", team=ALL_TEAMS, role=Role.ADMIN, by=by)
    accounts.set_password(db, "fuzzer", "another long fuzzing password", by=by)
    secret, _ = accounts.create_token(
        db, "fuzzer", name="fuzz", team=ALL_TEAMS, role=Role.ADMIN, expires_in=None, by=by
    )
    TOKEN["Authorization"] = f"Bearer {secret}"
    with db.begin() as conn:  # a scheduler leads, so /readyz answers 200 rather than 503
        leases.acquire(conn, "scheduler", holder="fuzz", epoch=None, lease_s=3600, now=db_now(conn))
    yield create_app(db, ApiSettings(), secret_key=SECRET)
    db.dispose()


def _fuzz(case: Any) -> None:
    case.call_and_validate(headers=TOKEN, checks=[not_a_server_error, response_schema_conformance])


def test_the_api_answers_every_generated_request_within_its_schema(fuzzed_app: Any) -> None:
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", fuzzed_app).exclude(
        path_regex=SELF_ENDING
    )
    failures: list[str] = []
    operations = 0
    for found in schema.get_all_operations():
        operation = found.ok()
        operations += 1
        run = given(case=operation.as_strategy())(_fuzz)
        run = settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            derandomize=True,
        )(run)
        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # one entry per operation that broke a check
            failures.append(f"{operation.label}: {str(exc)[:2000]}")
    assert operations > 30
    assert failures == [], "\n\n".join(failures)
