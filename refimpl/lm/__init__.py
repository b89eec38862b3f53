"""A minimal, CUDA-capable LM trainer built only on the verified losses.

``model`` (nanoGPT-like decoder with a KV cache), ``tasks`` (addition, sort; rewards; held-out
sets), ``rollout`` (group sampling and the trainer's log-probs under the same sampling policy),
``train`` (warm-up, RL with any ``refimpl.losses`` preset, PPO-RLHF, the run loop),
``checkpoint``, ``distributed`` (DDP helpers) and ``cli`` (``refimpl train`` / ``refimpl eval``).
"""
