"""The package's version: the export records it in mla_graph.json, `mla-export --version` and the
server print it. The root package re-exports it."""

__version__ = "0.1.0"
