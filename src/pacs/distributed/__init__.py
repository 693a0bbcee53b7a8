"""What makes the loop run on N processes: small modules of free functions, one concern each.

    world.py        `World`: this process's rank, the world size, its device and strategy
                    (torchrun / accelerate launch environment), and the step's share of prompts
    collectives.py  every collective pacs calls: sums, gathers, what rank 0 alone does, what
                    every rank does with one error for all
    wrapping.py     loading a model once (rank 0) and wrapping it for the strategy (DDP, FSDP2)
    generation.py   the policy unsharded for the whole of a `generate` call
    state_dict.py   a model's and an optimizer's state streamed to rank 0 one tensor at a time
                    (checkpoints, weight pushes), and back as each rank's shard

The loop in `pacs.train.trainer` reads as the algorithm and asks these who does what:

    world = World.from_environment(config.train.strategy)     # torchrun / accelerate launch env
    model = wrap_model(world, model)                           # DDP or FSDP2 (or nothing)
    local_prompts = world.shard_prompts(step_prompts, mini_batch_size)
    ... generate / score / update on the local share ...
    metrics = mean_over_ranks(world, metrics, weights)         # global, on every rank
    if world.is_writer: write files                            # rank 0 alone

Sharding a step (DESIGN.md, section 6). Every rank draws the same `train.batch_size` prompts
(same sampler state), cuts them into the step's mini-batches of `train.mini_batch_size` prompts,
and takes the r-th contiguous slice of each: rank r's k-th local mini-batch is a share of the
global mini-batch k, so an N-process update sees exactly the mini-batches of a 1-process update.
A prompt's whole group lives on one rank, so group statistics stay local.

Exactness. Every loss is "sum over the global mini-batch / a global count"; each rank
back-propagates its own rows divided by the global count (`sum_over_ranks` gives the counts), and
the gradients are summed across ranks: DDP and FSDP2 average, so the loop scales each local loss
by the world size (`World.loss_scale`).

FSDP2 (`train.strategy=fsdp`): `fully_shard` each decoder layer, then the root; parameters,
gradients and optimizer state are sharded, and gradients stay sharded between micro-batches
(each backward reduce-scatters: more communication than one reduction per update, but no rank
ever holds a whole unsharded gradient). The frozen KL reference is sharded the same way
(`wrap_frozen_model`). Generation unshards every layer once and keeps them unsharded until it
ends (`unsharded_for_generation`), so it never all-gathers per token (and ranks may generate
different numbers of tokens without a collective to hang on). Checkpoints gather the model's state
(`named_state`) and the optimizer's to rank 0 one tensor at a time (`full_tensors_on_rank0`),
which writes each into files of bounded size as it comes; on resume, the optimizer state is read
by rank 0 alone and sent to each rank as its shard (`from_rank0_like`).

Collectives. Every `torch.distributed` collective pacs calls is in `collectives.py`, and each one
hands the backend its tensors on the device that backend serves (`communication_device`): NCCL
serves CUDA tensors only, gloo CPU ones, so a caller may build its counts on the CPU whatever the
backend. `tests/distributed/test_distributed_runs.py` keeps it so: a 2-process training run fails if pacs
calls a collective from anywhere else (tests/helpers/collective_audit.py; vLLM's own code may: its engine,
built in each process, sets its process groups up on the job's and generates on them).

Several nodes. Nodes may share nothing but the network (node-local disks). Rank 0 alone reads
what only it may see (the checkpoint to resume, the models `load_on_rank0` loads) and sends every
rank its part; a decision every rank must take alike is rank 0's (`run_on_rank0`); and what each
node reads from its own disk (the tokenizer, the data, a LoRA base model) is read under
`run_on_every_rank` (each node's first rank first when it fills the node's cache), so that a node
that lacks it stops every rank with one error naming that node, instead of leaving the others
waiting in a collective it never joins.

One process (no launcher) is the trivial case: nothing is wrapped and every collective is the
identity.
"""
