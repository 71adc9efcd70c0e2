"""fedshift: federated learning under distribution shift, with clients as a tensor dimension."""

__version__ = "0.1.0"
