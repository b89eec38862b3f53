"""The conformance tests on acme_rl.planted_bug (a copy with bugs planted): run on purpose with
``pytest planted`` to see the failures; CI requires them (../../README.md)."""

from refimpl.pytest_plugin import advantage_tests, loss_tests

test_dapo_loss = loss_tests("acme_rl.planted_bug:dapo_loss", preset="dapo")
test_grpo_advantages = advantage_tests("acme_rl.planted_bug:grpo_advantages")
