"""A minimal, CUDA-capable LM trainer built only on the verified losses.

``model`` (nanoGPT-like decoder with a KV cache), ``tasks`` (addition, sort; rewards; held-out
sets), ``rollout`` (group sampling and the trainer's log-probs under the same sampling policy),
``config`` (``TrainConfig``, validated), ``train`` (the ``Trainer``: warm-up step, RL step with any
``refimpl.losses`` preset, PPO-RLHF with ``rlhf``), ``batch`` (a step's data, the advantage
conventions), ``run`` (the run as named phases: metrics, checkpoints, resume, Ctrl-C),
``progress`` (what a run prints), ``plots``, ``checkpoint`` (checksummed, atomic),
``distributed`` (DDP helpers) and ``cli`` (``refimpl train`` / ``eval`` / ``sample`` /
``compare``).
"""
