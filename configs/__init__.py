"""YAML recipes shipped with pacs; `pacs train --config builtin:NAME` reads configs/NAME.yaml."""
