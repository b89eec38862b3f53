"""acme-rl against rl-oracle: each line expands into one test per case class of the conformance kit
(e.g. test_dapo_loss[masked_nonfinite]); a failure shows the smallest failing case in full."""

from refimpl.pytest_plugin import advantage_tests, kl_tests, logprob_tests, loss_tests

test_dapo_loss = loss_tests("acme_rl.losses:dapo_loss", preset="dapo")
test_kl_k3 = kl_tests("acme_rl.losses:kl_k3", estimator="k3")
test_grpo_advantages = advantage_tests("acme_rl.advantages:grpo_advantages")
test_token_logprobs = logprob_tests("acme_rl.logprobs:token_logprobs")
