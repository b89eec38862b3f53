"""Exact ground truth for finite MDPs (numpy/scipy float64; sympy rationals for tiny cases).

This layer imports neither ``refimpl`` nor ``specs`` (docs/architecture.md, contract). Every public
name of the submodules is re-exported here (each submodule lists its names in ``__all__``).
"""

from tabular.control import *  # noqa: F403
from tabular.evaluation import *  # noqa: F403
from tabular.exact import *  # noqa: F403
from tabular.examples import *  # noqa: F403
from tabular.gradients import *  # noqa: F403
from tabular.improvement import *  # noqa: F403
from tabular.mdp import *  # noqa: F403
from tabular.sequences import *  # noqa: F403
from tabular.trajectories import *  # noqa: F403
