"""Alembic environment: runs migrations on the connection treadle hands over, or (offline,
`treadle db upgrade --sql`) renders them as SQL for the dialect treadle names."""

from __future__ import annotations

from alembic import context

from treadle.store.tables import bind_dialect, metadata

if context.is_offline_mode():
    dialect_name = context.config.attributes["dialect_name"]
    bind_dialect(dialect_name)
    context.configure(
        dialect_name=dialect_name,
        target_metadata=metadata,
        render_as_batch=dialect_name == "sqlite",
        literal_binds=True,
        compare_type=True,
        output_buffer=context.config.attributes["output"],
    )
else:
    connection = context.config.attributes["connection"]
    bind_dialect(connection.dialect.name)
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
with context.begin_transaction():
    context.run_migrations()
