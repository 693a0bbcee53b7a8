"""pacs: PACS and its baselines for reinforcement learning from verifiable rewards."""

__version__ = "0.1.0"

EVAL_SAMPLING = {"temperature": 0.6, "top_p": 0.95}
"""The paper's evaluation sampling: the default of validation during training (`eval.*`), of
`pacs eval`, `pacs compare` and the demo. Here, in the one module every entry point imports
without torch (the command line's defaults)."""
