from inference_service.models import Base

from services.common.migrations_env import run_migrations

run_migrations(Base.metadata)
