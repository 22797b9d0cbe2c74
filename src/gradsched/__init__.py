"""gradsched: schedule gradient communication for data-parallel PyTorch training.

The pipeline: a :class:`~gradsched.profile.Profile` (what the model computes) and a
:class:`~gradsched.cluster.Cluster` (what the network costs) go into a planner,
which returns a :class:`~gradsched.plan.Plan`; the simulator predicts it and
``gradsched.torch`` runs it.  Nothing here imports torch.
"""

from gradsched.cluster import Cluster, CollectiveCost
from gradsched.errors import FormatError, GradschedError
from gradsched.plan import Operation, Plan, Slice
from gradsched.profile import Profile, TensorProfile

__version__ = "0.1.0"
__all__ = ["Cluster", "CollectiveCost", "FormatError", "GradschedError", "Operation", "Plan", "Profile",
           "Slice", "TensorProfile", "__version__"]
