"""The one error of a malformed export (mla_graph.json, its files and the paths it names), in a
module of its own so that the contract, the file checks and the path checks can all raise it
without importing each other."""

__all__ = ["ContractError"]


class ContractError(ValueError):
    """mla_graph.json is missing, malformed, or disagrees with the graph files."""
