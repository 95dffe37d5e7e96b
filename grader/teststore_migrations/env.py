from grader.teststore import TestBase
from services.common.migrations_env import run_migrations

run_migrations(TestBase.metadata)
