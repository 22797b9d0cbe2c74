"""The job wing, torch-free: what a command hands its ranks, how they are started, what comes back.

- :mod:`gradsched.jobs.config`: the typed configurations the workers read (``TrainConfig``,
  ``BenchConfig`` with its ``dilate`` and ``scale_bytes``, ``BenchEntry``);
- :mod:`gradsched.jobs.launch`: the one launcher of a job's ranks, on loopback or the testbed
  (one environment, timeout, kill and prefix policy), used by ``bench``, ``train``, ``netbench``;
- :mod:`gradsched.jobs.results`: the typed results (``BenchResult``, ``BenchRow``,
  ``Contention``, ``TrainResult``), each duration marked run or emulated, and the one
  conversion to emulated seconds (:func:`~gradsched.jobs.results.to_emulated`);
- :mod:`gradsched.jobs.bench`: the bench's domain rules (rows, emulation fidelity limit,
  memory admission and byte scale, the result as the user reads it).

The workers that fill these (``gradsched.torch.jobs``) import torch; nothing here does.
"""
