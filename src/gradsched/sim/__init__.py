"""The discrete-event simulator: Plan x Profile x Cluster -> predicted iteration.

``simulate(plan, profile, cluster)`` returns a :class:`SimResult` with the steady-state
iteration time, the exposed communication, the peak extra memory and a Timeline.
"""

from gradsched.sim.engine import SimResult, simulate

__all__ = ["SimResult", "simulate"]
