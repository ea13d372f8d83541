"""The gateway's own state, in one SQL database: the embedded SQLite file by default, a Postgres shared
by the replicas when `database.url` names one.

`database` owns the engine, the schema migrations run at startup and the translation of a database that
is down or slow into `DatabaseUnavailable` (503); `tables` is the schema as SQLAlchemy Core tables;
one module per kind of record holds its store (`responses`: the Responses API's stored responses).
Everything the control plane keeps later (keys, usage) goes through the same `Database`.
"""
