from .store import DEFAULT_DB, RunStore

__all__ = ["DEFAULT_DB", "RunStore"]
