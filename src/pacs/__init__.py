"""pacs: PACS and its baselines for reinforcement learning from verifiable rewards."""
__version__ = "0.1.0"
