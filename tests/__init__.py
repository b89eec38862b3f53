"""The oracle: property tests tying specs/, tabular/ and refimpl/ together.

A regular package (not a namespace) so that a ``tests`` package installed by another distribution
(verl and OpenRLHF ship one into site-packages) cannot shadow ``tests.strategies``.
"""
