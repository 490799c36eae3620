"""All SQL of treadle: tables, migrations, and one module of named queries per aggregate."""
