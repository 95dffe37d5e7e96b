from services.common.migrations_env import run_migrations
from trainer_service.models import Base

run_migrations(Base.metadata)
