from .metrics import accuracy_percent, mean_std, summarize

__all__ = ["accuracy_percent", "mean_std", "summarize"]
