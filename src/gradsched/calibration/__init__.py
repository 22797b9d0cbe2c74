"""Measure -> calibrate: turning what was measured into the planners' Profile and Cluster.

Torch-free, beside the planners (it uses the formats and the simulator's contention
model, never torch); the torch side measures (:mod:`gradsched.torch.measure`, the
tuner's trace) and hands plain numbers and events in.

- :mod:`.insitu`: a trace of training iterations -> a measured Profile, service
  points, a fitted Cluster (run-time ``auto``).
- :mod:`.decisions`: run-time ``auto``'s rules: keep, re-plan or revert; the trials' run-off and winner.
- :mod:`.budget`: the trials within a share of the time trained; candidates out of the running.
- :mod:`.contention`: the simulator's contention figures from the bench's probe, and
  pooled across jobs (``gradsched bench --contention-from``).
- :mod:`.runtime_costs`: a profile measured alone -> a step under a runtime.
- :mod:`.bounds`: the lower bound and the bound under contention.
"""

from gradsched.calibration.budget import TrialBudget, out_of_the_running
from gradsched.calibration.bounds import contention_bound_s, lower_bound_s
from gradsched.calibration.contention import (BUSY_NOISE_SE, OP_LATENCY_SHARE, across_jobs, contention_from_probe,
                                              contention_history, median_se, phase_costs, phase_slowdowns,
                                              this_machine)
from gradsched.calibration.decisions import clear_wins, decide, fastest, runoff_plans
from gradsched.calibration.insitu import (MIN_SERVICE_S, IssueTimes, StepRecord, fit_cluster, issue_times,
                                          measured_profile, service_points)
from gradsched.calibration.runtime_costs import calibrate, runtime_name, with_runtime_costs

__all__ = ["BUSY_NOISE_SE", "MIN_SERVICE_S", "OP_LATENCY_SHARE", "IssueTimes", "StepRecord", "TrialBudget", "across_jobs",
           "calibrate", "clear_wins", "contention_bound_s", "contention_from_probe", "contention_history", "decide",
           "fastest", "fit_cluster", "issue_times", "lower_bound_s", "measured_profile", "median_se",
           "out_of_the_running", "phase_costs", "phase_slowdowns", "runoff_plans", "runtime_name", "service_points",
           "this_machine", "with_runtime_costs"]
