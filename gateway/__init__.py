"""dpgate's gateway: configuration, SQL analysis and compilation, execution, HTTP, CLI."""

__version__ = "0.1.0"

#: The PostgreSQL version whose protocol and catalogue dpgate emulates (server_version).
POSTGRES_VERSION = "15.0"

#: What ``SELECT version()`` answers, over HTTP and the PostgreSQL protocol alike: fixed
#: text naming the emulated PostgreSQL (clients parse its start) and dpgate — never the
#: engine that holds the data or answers the catalogue.
VERSION_TEXT = f"PostgreSQL {POSTGRES_VERSION} (dpgate {__version__}, differentially private)"
