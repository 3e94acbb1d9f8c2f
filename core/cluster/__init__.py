"""Ray clusters from the client's side: reaching an address, the token, connecting the driver, jobs, throwaway local clusters.

- :mod:`paretolab.cluster.reach` — fail fast on an address nothing answers at.
- :mod:`paretolab.cluster.ray_auth` — find this machine's Ray token, never print it.
- :mod:`paretolab.cluster.ray_init` — connect the driver to a local Ray or a cluster, with the environment workers need.
- :mod:`paretolab.cluster.jobs` — studies as Ray jobs (`paretolab submit`, `paretolab jobs`), Ray's job API wrapped once.
- :mod:`paretolab.cluster.localcluster` — a Ray head and nodes, PostgreSQL and an MLflow server on loopback (tests, benchmarks).
"""
