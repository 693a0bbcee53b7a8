"""The built-in algorithms' sections, one module each: `NAME.py` holds the one section (a subclass of
`pacs.config.algorithms.base.BaseAlgorithmConfig`) whose `name` is ``Literal["NAME"]``.
`pacs.config.algorithms.registry` finds every module here, so adding a module adds the algorithm;
nothing lists them."""
