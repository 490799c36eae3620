"""The SQLite database file: created private (mode 0600) before SQLite first opens it.

SQLite gives the -wal and -shm files it creates later the database file's permissions, so a
private database file keeps them private too, whatever the umask. Only creates; never changes
the mode of an existing file (an operator may have chosen it).
"""

from __future__ import annotations

import os
from pathlib import Path

from treadle.store.database import Database

#: Owner read and write only.
PRIVATE_FILE_MODE = 0o600


def create_private_sqlite_file(db: Database) -> Path | None:
    """Create `db`'s SQLite file empty with mode 0600 if it does not exist; return the path created.

    Does nothing (None) for other databases, in-memory SQLite, an existing file, or a missing
    parent directory (SQLite then reports the path it cannot open).
    """
    if not db.is_sqlite:
        return None
    name = db.engine.url.database
    if not name or name == ":memory:" or name.startswith("file:"):
        return None
    path = Path(name)
    if path.exists() or not path.parent.is_dir():
        return None
    # An empty file is a valid, empty SQLite database. O_EXCL: another process won the race.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return None
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # the open's mode passes through the umask; this does not
    finally:
        os.close(fd)
    return path
