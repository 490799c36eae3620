"""The web UI: server-rendered pages (Jinja2) in the API's process, behind the same guard."""
