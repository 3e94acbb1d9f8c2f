"""Where studies live and how they are written: Optuna storage, MLflow tracking, one owner per study.

- :mod:`paretolab.stores.locations` — the store URLs from flags, environment, config file or defaults; redaction.
- :mod:`paretolab.stores.open` — opening a store (created only by `run`), every failure as one line that says what to do.
- :mod:`paretolab.stores.ownership` — one driver per study and store creation one process at a time (locks that die with their holder).
- :mod:`paretolab.stores.tracking` — MLflow: one parent run per study, one run per trial (the driver is its only writer).
"""

from paretolab.stores.locations import (
    OPTUNA_ENV,
    TRACKING_ENV,
    Stores,
    has_password,
    redact,
    resolve_stores,
)

__all__ = ["OPTUNA_ENV", "TRACKING_ENV", "Stores", "has_password", "redact", "resolve_stores"]
