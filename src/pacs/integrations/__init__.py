"""PACS inside other training frameworks, each an optional extra that pacs never imports itself:

    pacs.integrations.trl   a drop-in for TRL's `GRPOTrainer` (`pip install 'pacs[trl]'`)
    pacs.integrations.verl  PACS in verl's registries (`pip install 'pacs[verl]'`)

Both compute PACS with `pacs.algos`, the math pacs's own trainer uses.
"""
