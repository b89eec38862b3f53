"""acme-rl: an example framework's RL-for-LLM building blocks (a DAPO loss, a k3 KL estimator,
GRPO advantages, token log-probs), tested against rl-oracle by its own pytest suite."""

__version__ = "0.1.0"
