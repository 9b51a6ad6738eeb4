"""dpgate's gateway: configuration, SQL analysis and compilation, execution, HTTP, CLI."""

__version__ = "0.1.0"
