"""Run-time ``auto``'s decisions, torch-free: its configuration, the schedule of what happens when, its rules.

The runtime's driver (:class:`gradsched.torch.runtime.autotune.AutoTuner`) measures,
broadcasts and switches plans; what it decides from the numbers lives here and in
:mod:`gradsched.calibration` (:mod:`~gradsched.calibration.decisions`: keep, re-plan,
revert, the trials' winner; :mod:`~gradsched.calibration.budget`: what the trials cost).

- :mod:`.config`: :class:`AutoTuneConfig`, the options of ``"auto"``, and which candidates are worth a window.
- :mod:`.candidates`: PyTorch's DDP as a candidate plan (:data:`TORCH_DDP`).
- :mod:`.schedule`: when profiling starts (paid out of the trials' budget, on the baseline until then).
- :mod:`.records`: the switches and checks ``auto`` reports, and what each plan measured (:class:`PlanMeasurements`).
"""

from gradsched.tuning.candidates import CANDIDATE_SIZES, TORCH_DDP, is_torch_ddp, label
from gradsched.tuning.config import AutoTuneConfig, not_clearly_slower, trials_option
from gradsched.tuning.records import Check, PlanMeasurements, Switch
from gradsched.tuning.schedule import profiling_cost_s, profiling_rest

__all__ = ["CANDIDATE_SIZES", "TORCH_DDP", "AutoTuneConfig", "Check", "PlanMeasurements", "Switch", "is_torch_ddp", "label",
           "not_clearly_slower", "profiling_cost_s", "profiling_rest", "trials_option"]
