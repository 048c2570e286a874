"""Monte Carlo campaigns: many independent batches, each run exactly once however the work
was scheduled, lost and re-run, and a signed certificate that says so.

- :mod:`~kronos_audit.runtime.campaigns.ledger`: each batch's generator (a function of the
  seed and its index) and the ledger of results that travels with every checkpoint;
- :mod:`~kronos_audit.runtime.campaigns.split`: the batches still to do, dealt over the ranks;
- :mod:`~kronos_audit.runtime.campaigns.batches`: one attempt at a campaign
  (``run.batches(n)``, ``run.map_batches(fn, n)``): what each checkpoint call offers;
- :mod:`~kronos_audit.runtime.campaigns.executors`: the engines (this process, any
  ``concurrent.futures`` executor, Dask, Ray);
- :mod:`~kronos_audit.runtime.campaigns.calls`: what an engine call carries (a group of
  batches) and the watch that ends a pool worker whose driver is gone;
- :mod:`~kronos_audit.runtime.campaigns.array`: one task of a Slurm job array;
- :mod:`~kronos_audit.runtime.campaigns.certify`: signing a finished campaign's certificate.
"""
