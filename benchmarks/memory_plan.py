"""Per-rank GPU memory of a training step, phase by phase, by simulation (`pacs.train.memory_plan`,
whose docstring says how): the paper's models at the paper's world size, the colocated vLLM engine
included.

Run: `.venv/bin/python benchmarks/memory_plan.py [CONFIG ...] [--world-size N] [--gpu-gib G]
[--markdown] [--json] [--jobs N] [--check]`.
"""

from pacs.train.memory_plan import main

if __name__ == "__main__":
    main()
