"""A minimal, CUDA-capable LM trainer built only on the verified losses.

``model`` (nanoGPT-like decoder with a KV cache), ``tasks`` (addition, sort; rewards; held-out
sets), ``rollout`` (group sampling and the trainer's log-probs under the same sampling policy),
``config`` (``TrainConfig``, validated), ``recipes`` (what each ``--loss`` name means: the one
home of loss-dependent defaults), ``train`` (the ``Trainer``: warm-up step, RL step), its parts
``experience`` (groups, rewards, dynamic sampling, old/reference log-probs, PPO-RLHF advantages
with ``rlhf``), ``batch`` (a step's data, the advantage conventions) and ``metrics`` (the update's
metrics), ``run`` (the run as named phases: metrics, checkpoints, resume, Ctrl-C, write failures)
with ``folder`` (the output folder), ``lock`` (one owner per folder), ``history`` (the metrics a
resume continues: torn and mixed files), ``files`` (atomic writes, disk full as one line) and
``saved`` (a saved run: restore, --init-from, eval, sample), ``progress``
(what a run prints), ``plots``, ``checkpoint`` (checksummed, atomic), ``distributed`` (DDP
helpers) and ``cli`` (``refimpl train`` / ``eval`` / ``sample`` / ``compare``).
"""
